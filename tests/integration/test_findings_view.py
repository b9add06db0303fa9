"""`splitbrain ui` in a real browser (Debian's chromium through chromium-driver) over a real
findings topic: the list and its filters, the acceptance history's timeline, markup shown as
text, and the token beyond loopback."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from detector.contracts.findings import Finding, Severity, Status
from detector.devstack.kafka import LocalKafka
from detector.testing.view import publish, running_view

from .kafka_harness import broker_env, create_topic, splitbrain, unique
from .test_tail import seed_finding

EVIL = "<script>document.title='pwned';alert(1)</script><img src=x onerror=alert(2)>\x1b[2J"
TOKEN = "a-token-of-the-test-0123456789"


def variant(finding_id: str, workflow: str, severity: Severity, status: Status) -> Finding:
    return seed_finding().model_copy(
        update={
            "finding_id": finding_id,
            "workflow_key": workflow,
            "severity": severity,
            "status": status,
        }
    )


@pytest.fixture(scope="module")
def seed() -> Finding:
    return seed_finding()


@pytest.fixture(scope="module")
def topic(kafka_broker: LocalKafka, seed: Finding) -> str:
    """The acceptance history's finding (its revisions 1 to the latest), and a few others."""
    name = create_topic(kafka_broker, unique("view-findings"), 3)
    revisions = [
        seed.model_copy(update={"revision": n, "severity": Severity.WARNING})
        for n in range(1, seed.revision)
    ]
    publish(
        kafka_broker.client_config(),
        name,
        [
            variant("f-resolved", "wf-resolved", Severity.CRITICAL, Status.RESOLVED),
            variant("f-info", "wf-info", Severity.INFO, Status.OPEN),
            *revisions,
            seed,
            variant("f-warning", "wf-warning", Severity.WARNING, Status.OPEN),
            variant("f-evil", EVIL, Severity.WARNING, Status.OPEN),
        ],
    )
    return name


@pytest.fixture(scope="module")
def env(kafka_broker: LocalKafka, topic: str) -> dict[str, str]:
    return broker_env(kafka_broker, SPLITBRAIN_UI_FINDINGS_TOPIC=topic)


@pytest.fixture(scope="module")
def view(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_view(env, tmp_path_factory.mktemp("view") / "view.log") as url:
        yield url


def submitted(browser: webdriver.Chrome, query: str) -> None:
    """Until the next page has loaded: `query` in its address, and the page complete."""
    WebDriverWait(browser, 30).until(
        lambda b: (
            query in b.current_url and b.execute_script("return document.readyState") == "complete"
        )
    )


def rows(browser: webdriver.Chrome) -> list[tuple[str, str, str]]:
    return [
        (
            str(r.get_attribute("data-status")),
            str(r.get_attribute("data-severity")),
            str(r.get_attribute("data-finding-id")),
        )
        for r in browser.find_elements(By.CSS_SELECTOR, "table.findings tr.finding-row")
    ]


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, _lower(answer.headers.items()), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, _lower(exc.headers.items()), exc.read().decode()


def _lower(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}


def test_open_findings_first_and_the_filters(
    browser: webdriver.Chrome, view: str, seed: Finding
) -> None:
    browser.get(view)
    assert rows(browser) == [
        ("open", "critical", seed.finding_id),
        ("open", "warning", "f-evil"),
        ("open", "warning", "f-warning"),
        ("open", "info", "f-info"),
        ("resolved", "critical", "f-resolved"),
    ]
    Select(browser.find_element(By.NAME, "severity")).select_by_value("critical")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    submitted(browser, "severity=critical&status=&")
    assert [r[2] for r in rows(browser)] == [seed.finding_id, "f-resolved"]
    Select(browser.find_element(By.NAME, "status")).select_by_value("resolved")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    submitted(browser, "severity=critical&status=resolved&")
    assert [r[2] for r in rows(browser)] == ["f-resolved"]
    browser.get(view + "?workflow=wf-")
    assert [r[2] for r in rows(browser)] == ["f-warning", "f-info", "f-resolved"]
    browser.get(view + "?workflow=nothing-like-it")
    assert browser.find_element(By.CSS_SELECTOR, "p.empty").text == "No finding matches."


def test_a_finding_shows_its_revisions_and_the_acceptance_timeline(
    browser: webdriver.Chrome, view: str, seed: Finding
) -> None:
    browser.get(view)
    browser.find_element(By.LINK_TEXT, seed.workflow_key).click()
    submitted(browser, f"findings/{seed.finding_id}")
    lanes = browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.lane")
    assert [lane.text for lane in lanes] == [
        "epoch 17 (displaced) · worker-alpha",
        "epoch 18 · worker-beta",
    ]
    (takeover,) = browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.transition")
    assert takeover.get_attribute("data-seq") == "5"
    labels = browser.find_elements(By.CSS_SELECTOR, "svg.timeline .mark-label")
    assert [label.text for label in labels] == [
        "stale_activity · seq 6",
        "stale_effect_attempt · seq 7",
        "stale_effect_committed · seq 8",
        "duplicate_effect · seq 9",
    ]
    revisions = browser.find_elements(By.CSS_SELECTOR, "table.revisions tr.revision")
    assert [r.get_attribute("data-revision") for r in revisions] == [
        str(n) for n in range(seed.revision, 0, -1)
    ]
    assert browser.find_element(By.CSS_SELECTOR, "p.witness").text.startswith(
        "worker-alpha lost epoch 17"
    )


def test_a_finding_downloads_as_one_self_contained_file(view: str, seed: Finding) -> None:
    status, headers, body = fetch(f"{view}findings/{seed.finding_id}.html")
    assert status == 200
    assert headers["content-disposition"].startswith("attachment;")
    assert f'data-finding-id="{seed.finding_id}"' in body
    head = body.split("<svg")[0]
    assert "<script" not in body and 'href="/' not in body and "://" not in head
    assert fetch(f"{view}findings/no-such-finding")[0] == 404


def test_a_workflow_key_with_markup_is_shown_as_text_and_runs_nothing(
    browser: webdriver.Chrome, view: str
) -> None:
    shown = EVIL.replace("\x1b", "\\x1b")
    for page, title in ((view, "splitbrain findings"), (f"{view}findings/f-evil", shown)):
        browser.get(page)
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018 (reading it is the check)
        assert browser.title.endswith(title)  # the script's title would be "pwned"
        assert browser.find_elements(By.TAG_NAME, "script") == []
        assert browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.find_element(By.CSS_SELECTOR, "section.finding .workflow").text == shown
    browser.get(view)
    assert shown in browser.find_element(By.CSS_SELECTOR, "table.findings").text


def test_metrics_and_health(view: str) -> None:
    fetch(view)
    status, _, body = fetch(view + "metrics")
    assert status == 200
    assert 'splitbrain_ui_findings{status="open"} 4.0' in body
    assert 'splitbrain_ui_findings{status="resolved"} 1.0' in body
    assert 'splitbrain_ui_requests_total{code="200",route="/"}' in body
    assert "splitbrain_ui_caught_up 1.0" in body
    assert fetch(view + "healthz")[:3:2] == (200, "ready")


def test_beyond_loopback_without_a_token_it_refuses_to_start(env: dict[str, str]) -> None:
    done = splitbrain("ui", "--listen", "0.0.0.0:0", env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "splitbrain ui: refusing to listen on 0.0.0.0:0 without a token: beyond loopback the "
        "view needs --token-file PATH (or SPLITBRAIN_UI_TOKEN)"
    ]


def test_beyond_loopback_a_request_without_the_token_is_refused(
    browser: webdriver.Chrome, env: dict[str, str], tmp_path: Path, seed: Finding
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    argv = ("--listen", "0.0.0.0:0", "--token-file", str(token))
    with running_view(env, tmp_path / "view.log", *argv) as url:
        local = url.replace("0.0.0.0", "127.0.0.1")
        for path in ("", f"findings/{seed.finding_id}", "metrics"):
            status, headers, body = fetch(local + path)
            assert status == 401 and headers["www-authenticate"].startswith("Bearer")
            assert seed.workflow_key not in body and "<svg" not in body
        assert fetch(local + "metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert fetch(local + "healthz")[0] == 200
        browser.get(f"{local}findings/{seed.finding_id}")
        assert browser.find_elements(By.CSS_SELECTOR, "svg.timeline") == []
        field = browser.find_element(By.NAME, "token")
        field.send_keys("not-the-token-at-all")
        field.submit()
        submitted(browser, "/login?next=")
        assert browser.find_elements(By.CSS_SELECTOR, "p.banner")
        field = browser.find_element(By.NAME, "token")
        field.send_keys(TOKEN)
        field.submit()
        submitted(browser, f"{local}findings/{seed.finding_id}")
        assert browser.current_url == f"{local}findings/{seed.finding_id}"
        assert browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.transition")
