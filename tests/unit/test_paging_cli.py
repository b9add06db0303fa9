"""`splitbrain page` settings (flags, `SPLITBRAIN_PAGE_` variables, secrets) and the example
Alertmanager configuration, without a broker."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from detector.cli.main import build_parser, main
from detector.cli.page import PageCommandSettings
from detector.contracts.findings import Severity
from detector.contracts.page_state import SinkName
from detector.paging.alertmanager import AlertmanagerSink
from detector.paging.pagerduty import PagerDutySink
from detector.paging.webhook import WebhookSink
from tests.paths import ROOT

EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
BOOT = ("--bootstrap-servers", "127.0.0.1:9")
SECRET = "R0UT1NG-s3cret-value"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os  # noqa: PLC0415

    for name in list(os.environ):
        if name.upper().startswith("SPLITBRAIN_"):
            monkeypatch.delenv(name)


def settings(*argv: str) -> PageCommandSettings:
    args = build_parser().parse_args(["page", *BOOT, *argv])
    assert isinstance(args, argparse.Namespace)
    return PageCommandSettings.from_args(args)


def test_sinks_come_from_flags_and_variables_several_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key_file = tmp_path / "pd-key"
    key_file.write_text(SECRET + "\n")
    monkeypatch.setenv("SPLITBRAIN_PAGE_WEBHOOK_URL", "https://hooks.example.com/sb")
    monkeypatch.setenv("SPLITBRAIN_PAGE_WEBHOOK_SECRET", "hmac-key")
    monkeypatch.setenv("SPLITBRAIN_PAGE_PAGERDUTY_MIN_SEVERITY", "CRITICAL")
    s = settings(
        "--alertmanager-url",
        "http://127.0.0.1:9093",
        "--pagerduty-routing-key-file",
        str(key_file),
        "--pagerduty-url",
        "http://127.0.0.1:1/v2/enqueue",
    )
    bridge = s.bridge_settings({"bootstrap.servers": "127.0.0.1:9"})
    am, pd, hook = (bridge.sinks[name] for name in SinkName)
    assert isinstance(am, AlertmanagerSink) and am.url == "http://127.0.0.1:9093"
    assert isinstance(pd, PagerDutySink) and pd.routing_key.get_secret_value() == SECRET
    assert pd.url == "http://127.0.0.1:1/v2/enqueue"
    assert isinstance(hook, WebhookSink) and hook.secret is not None
    assert bridge.policies[SinkName.PAGERDUTY].min_severity is Severity.CRITICAL
    assert bridge.policies[SinkName.ALERTMANAGER].min_severity is Severity.INFO
    assert set(bridge.secrets) == {SECRET, "hmac-key"}
    assert SECRET not in repr(s) and SECRET not in repr(bridge)


def test_the_finding_url_reaches_every_sink(capsys: pytest.CaptureFixture[str]) -> None:
    def links(*argv: str) -> list[str | None]:
        sinks = settings("--alertmanager-url", "http://am", "--webhook-url", "http://h", *argv)
        am, hook = sinks.sinks().values()
        assert isinstance(am, AlertmanagerSink) and isinstance(hook, WebhookSink)
        return [None if s.link is None else s.link.template for s in (am, hook)]

    template = "https://sb.example/findings/{finding_id}"
    assert links() == [None, None]
    assert links("--finding-url", template) == [template, template]
    code, err = run(capsys, "--webhook-url", "http://h", "--finding-url", "https://sb.example/")
    assert code == 2 and "--finding-url" in err and "{finding_id}" in err


def test_the_flag_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITBRAIN_PAGE_ALERTMANAGER_URL", "http://from-env:9093")
    monkeypatch.setenv("SPLITBRAIN_PAGE_GROUP_ID", "bridge-b")
    s = settings("--alertmanager-url", "http://from-flag:9093")
    assert (s.alertmanager_url, s.group_id) == ("http://from-flag:9093", "bridge-b")
    # The worker's variable is the worker's: the bridge's group is not changed by it.
    monkeypatch.setenv("SPLITBRAIN_GROUP_ID", "detector")
    assert settings("--alertmanager-url", "http://x").group_id == "bridge-b"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(["page", *BOOT, *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_no_sink_is_an_error_that_says_how_to_add_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys)
    assert code == 2
    assert err == (
        "splitbrain page: no sink: pass --alertmanager-url or --webhook-url, or set "
        "SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY (or pass --pagerduty-routing-key-file)\n"
    )


def test_a_secret_is_never_a_flags_value(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "--alertmanager-url", "http://x", "--pagerduty-routing-key", SECRET)
    assert code == 2
    assert "set SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY or pass --pagerduty-routing-key-file" in err
    assert SECRET not in err
    code, err = run(capsys, "--webhook-url", "http://x", "--webhook-secret", SECRET)
    assert code == 2 and "SPLITBRAIN_PAGE_WEBHOOK_SECRET" in err and SECRET not in err


@pytest.mark.parametrize(
    ("env", "argv", "line"),
    [
        (
            {},
            ["--alertmanager-url", "ftp://am"],
            "--alertmanager-url='ftp://am': expected an http:// or https:// URL without "
            "credentials",
        ),
        (
            {"SPLITBRAIN_PAGE_WEBHOOK_URL": "https://user:pw@hooks.example.com/"},
            [],
            "SPLITBRAIN_PAGE_WEBHOOK_URL='https://user:pw@hooks.example.com/': expected an "
            "http:// or https:// URL without credentials",
        ),
        (
            {"SPLITBRAIN_PAGE_ALERTMANAGER_RESEND_INTERVAL_S": "0"},
            ["--alertmanager-url", "http://am"],
            "SPLITBRAIN_PAGE_ALERTMANAGER_RESEND_INTERVAL_S='0': expected seconds more than 0",
        ),
        (
            {"SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": ""},
            [],
            "SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY: expected a non-empty secret; unset the "
            "variable to use the default",
        ),
        (
            {"SPLITBRAIN_PAGE_WEBHOOK_SECRET": SECRET},
            [],
            "a webhook secret is set but no webhook: pass --webhook-url or set "
            "SPLITBRAIN_PAGE_WEBHOOK_URL",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_its_source(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    argv: list[str],
    line: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith(f"splitbrain page: {line}"), err
    assert len(err.splitlines()) == 1
    assert SECRET not in err


def test_help_names_the_page_variables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "detector.cli", "page", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    flat = " ".join(out.split())
    for var in (
        "SPLITBRAIN_PAGE_ALERTMANAGER_URL",
        "SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY",
        "SPLITBRAIN_PAGE_WEBHOOK_SECRET",
        "SPLITBRAIN_PAGE_METRICS_PORT",
        "SPLITBRAIN_BOOTSTRAP_SERVERS",
    ):
        assert var in flat.replace("- ", "-"), var
    assert "--pagerduty-routing-key-file" in flat
    assert "--pagerduty-routing-key " not in flat


# ---- the example Alertmanager configuration ---------------------------------------------------


def test_amtool_accepts_the_example_configuration(amtool: str) -> None:
    result = subprocess.run(
        [amtool, "check-config", str(EXAMPLE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_example_pages_page_tickets_ticket_and_groups_by_finding() -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    route = config["route"]
    assert "finding_id" in route["group_by"]
    routes = {tuple(r["matchers"]): r["receiver"] for r in route["routes"]}
    receivers = {r["name"]: r for r in config["receivers"]}
    assert "pagerduty_configs" in receivers[routes[('severity="page"',)]]
    assert "webhook_configs" in receivers[routes[('severity="ticket"',)]]
    pagerduty = receivers[routes[('severity="page"',)]]["pagerduty_configs"][0]
    assert "routing_key" not in pagerduty  # from a file, never in the configuration
