"""The HTML report opened in a real browser: Debian's chromium, driven by Selenium through
Debian's chromium-driver (no browser download). Without them these tests skip, saying what to
install, unless SPLITBRAIN_REQUIRE_TOOLS=1 (set by `.ci/run`) fails them instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from detector.cli import main
from detector.timeline.page import MAX_DRAWN
from tests.paths import ROOT, SEED_FIXTURE
from tests.unit.histories import seed_renamed

EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if p.suffix in (".jsonl", ".log"))
EVIL = "<script>document.title='pwned';alert(1)</script><img src=x onerror=alert(2)>\x1b[2J"


def html_report(history: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    code = main(["audit", str(history), "--fail-on", "none", "--html", str(out)])
    capsys.readouterr()
    assert code == 0 and out.exists()
    return out


def opened(browser: webdriver.Chrome, report: Path) -> webdriver.Chrome:
    browser.get(report.as_uri())
    return browser


def centre_x(element: WebElement) -> float:
    rect = element.rect
    return float(rect["x"] + rect["width"] / 2)


def test_acceptance_history_timeline(
    browser: webdriver.Chrome, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = opened(browser, html_report(SEED_FIXTURE, tmp_path / "r.html", capsys))
    lanes = page.find_elements(By.CSS_SELECTOR, "svg.timeline g.lane")
    assert [lane.text for lane in lanes] == [
        "epoch 17 (displaced) · worker-alpha",
        "epoch 18 · worker-beta",
    ]
    (takeover,) = page.find_elements(By.CSS_SELECTOR, "svg.timeline g.transition")
    assert takeover.get_attribute("data-seq") == "5"
    assert takeover.text == "takeover seq 5 (e05)"
    labels = page.find_elements(By.CSS_SELECTOR, "svg.timeline .mark-label")
    assert [label.text for label in labels] == [
        "stale_activity · seq 6",
        "stale_effect_attempt · seq 7",
        "stale_effect_committed · seq 8",
        "duplicate_effect · seq 9",
    ]
    # Drawn where the verdict put them: the stale events after the takeover's line, in red.
    line_x = centre_x(takeover.find_element(By.TAG_NAME, "line"))
    shape = {
        e.get_attribute("data-event-id"): e.find_element(By.CSS_SELECTOR, ".shape")
        for e in page.find_elements(By.CSS_SELECTOR, "svg.timeline g.event")
    }
    assert centre_x(shape["e02"]) < line_x < centre_x(shape["e06"])
    assert [centre_x(shape[e]) > line_x for e in ("e06", "e07", "e08", "e09")] == [True] * 4
    for stale in ("e07", "e08"):
        assert shape[stale].value_of_css_property("fill") == "rgb(220, 38, 38)"
    (pair,) = page.find_elements(By.CSS_SELECTOR, "svg.timeline .duplicate-pair")
    assert pair.get_attribute("data-effect-key") == "release-index/2026-07-26"


def test_a_workflow_key_with_markup_is_shown_as_text_and_runs_nothing(
    browser: webdriver.Chrome, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = seed_renamed(tmp_path / "evil.jsonl", EVIL)
    page = opened(browser, html_report(history, tmp_path / "r.html", capsys))
    with pytest.raises(NoAlertPresentException):
        page.switch_to.alert.text  # noqa: B018 (reading it is the check)
    assert "pwned" not in page.title
    assert page.find_elements(By.TAG_NAME, "script") == []
    assert page.find_elements(By.CSS_SELECTOR, "img") == []
    shown = page.find_element(By.CSS_SELECTOR, "section.finding .workflow").text
    assert shown == EVIL.replace("\x1b", "\\x1b")
    assert (
        page.find_element(By.CSS_SELECTOR, "svg.timeline title").get_attribute("textContent")
        == f"timeline of {shown}"
    )


@pytest.mark.parametrize("history", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_has_a_report(
    browser: webdriver.Chrome, history: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["audit", str(history), "--format", "json", "--fail-on", "none"])
    findings = capsys.readouterr().out.splitlines()
    page = opened(browser, html_report(history, tmp_path / "r.html", capsys))
    assert page.title == f"splitbrain audit: {history}"
    rows = page.find_elements(By.CSS_SELECTOR, "table.summary tr.finding-row")
    assert len(rows) == len(findings)
    sections = page.find_elements(By.CSS_SELECTOR, "section.finding")
    assert len(sections) == min(len(findings), MAX_DRAWN)
    for section in sections:
        assert section.find_elements(By.CSS_SELECTOR, "svg.timeline g.lane")
        assert section.find_elements(By.CSS_SELECTOR, "svg.timeline .mark-label")
