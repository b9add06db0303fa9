"""`splitbrain ui` without a broker: its settings and refusals at the edge, the list's order and
filters, and the pages' escaping and policy (the browser test runs them against Kafka)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from pathlib import Path

import pytest
from starlette.types import Message

from detector.cli.main import main
from detector.contracts.findings import Finding, Severity, Status
from detector.histories.audit import audit_lines
from detector.view import pages
from detector.view.app import create_app
from detector.view.metrics import ViewMetrics
from detector.view.store import Filters, FindingsStore, listed
from tests.paths import SEED_FIXTURE

EVIL = "<script>alert(1)</script>\x1b[2J"
BOOT = ("--bootstrap-servers", "127.0.0.1:9")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os  # noqa: PLC0415

    for name in list(os.environ):
        if name.upper().startswith("SPLITBRAIN_"):
            monkeypatch.delenv(name)


def seed(**update: object) -> Finding:
    (finding,) = audit_lines(SEED_FIXTURE.read_bytes().splitlines()).findings.values()
    return finding.model_copy(update=update)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(["ui", *BOOT, *argv]) == 2
    return capsys.readouterr().err.splitlines()


def test_beyond_loopback_without_a_token_it_refuses_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert refusal(capsys, "--listen", "0.0.0.0:8080") == [
        "splitbrain ui: refusing to listen on 0.0.0.0:8080 without a token: beyond loopback the "
        "view needs --token-file PATH (or SPLITBRAIN_UI_TOKEN)"
    ]


def test_bad_settings_name_their_flag_or_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (line,) = refusal(capsys, "--listen", "localhost:8080")
    assert line.startswith("splitbrain ui: --listen='localhost:8080': expected an IP address")
    short = tmp_path / "token"
    short.write_text("short\n")
    (line,) = refusal(capsys, "--token-file", str(short))
    assert line == (
        "splitbrain ui: --token-file: the token has 5 characters; use at least 16 (e.g. openssl "
        "rand -hex 32)"
    )
    monkeypatch.setenv("SPLITBRAIN_UI_LISTEN", "[::1]")
    (line,) = refusal(capsys)
    assert line.startswith("splitbrain ui: SPLITBRAIN_UI_LISTEN='[::1]': expected")


@pytest.mark.parametrize(
    "port",
    ["\N{ARABIC-INDIC DIGIT EIGHT}080", "80\N{FULLWIDTH DIGIT EIGHT}0", "\N{SUPERSCRIPT TWO}"],
)
def test_a_port_is_ascii_digits(capsys: pytest.CaptureFixture[str], port: str) -> None:
    """`str.isdigit` and `int` take any Unicode digit: `٨080` was port 8080."""
    (line,) = refusal(capsys, "--listen", f"127.0.0.1:{port}")
    assert line.startswith(f"splitbrain ui: --listen='127.0.0.1:{port}': expected an IP address")


def test_a_token_is_never_a_flags_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ui", *BOOT, "--token", "a-token-of-sixteen-chars"])
    assert "set SPLITBRAIN_UI_TOKEN or pass --token-file" in capsys.readouterr().err


def test_open_findings_first_then_the_worst_and_the_filters() -> None:
    findings = [
        seed(finding_id="r", workflow_key="a", status=Status.RESOLVED),
        seed(finding_id="i", workflow_key="b", severity=Severity.INFO),
        seed(finding_id="c", workflow_key="c", severity=Severity.CRITICAL),
        seed(finding_id="w", workflow_key="tenant-3/d", severity=Severity.WARNING),
    ]
    assert [f.finding_id for f in listed(findings, Filters())] == ["c", "w", "i", "r"]
    assert [f.finding_id for f in listed(findings, Filters(status=Status.RESOLVED))] == ["r"]
    assert [f.finding_id for f in listed(findings, Filters(severity=Severity.INFO))] == ["i"]
    assert [f.finding_id for f in listed(findings, Filters(workflow="tenant-3"))] == ["w"]


def test_pages_show_markup_as_text_and_allow_only_their_own_style() -> None:
    evil = seed(workflow_key=EVIL, finding_id="f/../<x>")
    for page in (
        pages.index([evil], Filters(workflow=EVIL), total=1, caught_up=True, failure=None),
        pages.finding([evil]),
        pages.finding([evil], export=True),
        pages.not_found(EVIL),
    ):
        assert "<script" not in page and "\x1b" not in page
        (style,) = re.findall(r"<style>(.*?)</style>", page, re.S)
        digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
        assert f"style-src 'sha256-{digest}'" in page
        assert "script-src" not in page and "default-src 'none'" in page
    assert pages.finding_path("f/../<x>") == "/findings/f%2F..%2F%3Cx%3E"
    assert 'href="/' not in pages.finding([evil], export=True)


def answered(token: str | None, host: str) -> tuple[int, float]:
    """The status of `GET /` with `host` as its Host header, and how often the view counted it."""
    store = FindingsStore()
    metrics = ViewMetrics(store)
    app = create_app(store, metrics, token=token)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", host.encode())],
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = int(sent[0]["status"])
    counted = metrics.registry.get_sample_value(
        "splitbrain_ui_requests_total", {"route": "/", "code": str(status)}
    )
    return status, counted or 0.0


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8080", 200),
        ("localhost:8080", 200),
        ("LOCALHOST", 200),
        ("[::1]:8080", 200),
        ("rebound.example:8080", 400),
        ("127.0.0.1.rebound.example", 400),
        ("www.localhost", 400),
    ],
)
def test_on_loopback_only_a_loopback_host_is_answered(host: str, status: int) -> None:
    """A DNS name rebound to 127.0.0.1 reaches the socket but not the pages; refusals count."""
    assert answered(None, host) == (status, 1.0)


def test_beyond_loopback_the_token_not_the_host_decides() -> None:
    assert answered("a-token-of-sixteen-chars", "view.example:8080") == (401, 1.0)
