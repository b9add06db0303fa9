"""`audit --html`: the report's structure, its escaping and its bounds, read without a browser
(tests/integration/test_html_report_browser.py opens it in Chromium)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from detector.cli import main
from detector.timeline.svg import MAX_POINTS, draw
from tests.paths import ROOT, SEED_FIXTURE
from tests.unit.histories import run, seed_history, seed_renamed

EVIL = "<script>alert(1)</script>\x1b[2J\x1b]0;owned\x07"


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of the document."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, css: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and css in (a.get("class") or "").split()]


def report(tmp_path: Path, history: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "report.html"
    main(["audit", str(history), "--html", str(out)])
    capsys.readouterr()
    return out.read_text()


def parsed(page: str) -> Elements:
    doc = Elements()
    doc.feed(page)
    return doc


def test_acceptance_history_draws_two_lanes_the_takeover_and_four_conditions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = parsed(report(tmp_path, SEED_FIXTURE, capsys))
    lanes = doc.having("g", "lane")
    assert [(a["data-epoch"], a["data-worker"]) for a in lanes] == [
        ("17", "worker-alpha"),
        ("18", "worker-beta"),
    ]
    assert [a["data-seq"] for a in doc.having("g", "transition")] == ["5"]
    labels = [(a["data-kind"]) for a in doc.having("text", "mark-label")]
    assert labels == [
        "stale_activity",
        "stale_effect_attempt",
        "stale_effect_committed",
        "duplicate_effect",
    ]
    assert [a["data-seq"] for a in doc.having("g", "stale")] == ["7", "8"]
    assert [a["data-effect-key"] for a in doc.having("path", "duplicate-pair")] == [
        "release-index/2026-07-26"
    ]
    assert doc.having("svg", "timeline")[0]["data-ordering"] == "authoritative_seq"
    rows = doc.having("tr", "finding-row")
    assert [(r["data-severity"], r["data-status"]) for r in rows] == [("critical", "open")]


def test_the_report_loads_nothing_and_allows_no_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = parsed(report(tmp_path, SEED_FIXTURE, capsys))
    assert not [t for t, _ in doc.tags if t in ("script", "link", "img", "iframe", "object")]
    (csp,) = [a for t, a in doc.tags if t == "meta" and a.get("http-equiv")]
    assert "default-src 'none'" in (csp["content"] or "")


def test_a_workflow_key_with_markup_and_terminal_escapes_is_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = report(tmp_path, seed_renamed(tmp_path / "evil.jsonl", EVIL), capsys)
    assert "<script" not in page
    assert "\x1b" not in page and "\x07" not in page
    doc = parsed(page)
    assert "<script>alert(1)</script>\\x1b[2J\\x1b]0;owned\\x07" in "".join(doc.text)
    assert doc.having("g", "transition")  # the finding is still drawn


def test_a_long_workflow_is_drawn_near_its_episode_and_says_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = SEED_FIXTURE.read_text().splitlines()[:9]
    base = json.loads(lines[-1])
    # Heartbeats of the new owner and, between them, verifications: the report keeps every
    # verification (up to its bound) but draws only the nearest to the episode.
    tail = [
        json.dumps({**base, "event_id": f"x{i}", "seq": 100 + i, "owner_epoch": 18,
                    **({"kind": "heartbeat", "worker_id": "worker-beta", "source": "worker"}
                       if i % 2 else {"kind": "outcome_verified", "worker_id": "verifier",
                                      "source": "verifier"})})
        for i in range(5000)
    ]  # fmt: skip
    history = tmp_path / "long.jsonl"
    history.write_text("\n".join(lines + tail) + "\n")
    page = report(tmp_path, history, capsys)
    doc = parsed(page)
    drawn = doc.having("g", "event")
    assert len(drawn) == MAX_POINTS
    assert len(doc.having("text", "mark-label")) == 4
    assert "events of this workflow left out of the figure" in page
    assert len(page) < 200_000


def test_an_unwritable_report_exits_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["audit", str(SEED_FIXTURE), "--html", str(tmp_path / "no" / "r.html")])
    assert code == 2
    assert "--html" in capsys.readouterr().err


def test_the_displaced_owners_fence_is_drawn_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = parsed(report(tmp_path, ROOT / "examples" / "job-queue.log", capsys))
    fences = [(a["data-kind"], a["data-epoch"]) for a in doc.having("g", "fence")]
    assert fences == [("effect_rejected", "42"), ("lease_lost", "42")]
    assert [a["data-kind"] for a in doc.having("g", "mark")] == [
        "heartbeat",
        "effect_attempted",
        "effect_rejected",
    ]
    assert "lease_lost" in doc.text


def test_a_finding_alone_draws_its_lanes_takeover_and_conditions() -> None:
    """What a view over the findings topic has: no events, only the finding."""
    finding = run(seed_history()).finding("export-ledger", 17)
    doc = parsed(draw(finding, []).svg)
    assert [a["data-epoch"] for a in doc.having("g", "lane")] == ["17", "18"]
    assert [a["data-seq"] for a in doc.having("g", "transition")] == ["5"]
    assert [a["data-seq"] for a in doc.having("g", "mark")] == ["6", "7", "8", "9"]
    # The stale commit is a condition too: the duplicate's pair is known from the finding.
    assert len(doc.having("path", "duplicate-pair")) == 1
