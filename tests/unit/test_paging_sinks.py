"""What the bridge sends each sink (Alertmanager, PagerDuty, the webhook) and how it takes their
answers, against local stdlib servers: requests, schema, signatures, retries and dead letters."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from detector.contracts.findings import Finding
from detector.contracts.page_state import Sent, SinkName
from detector.devstack.process import free_port
from detector.paging.alertmanager import AlertmanagerSink, endpoint
from detector.paging.delivery import (
    Backoff,
    DeliveryOutcome,
    Request,
    classify,
    origin,
    post,
    redact,
)
from detector.paging.links import FindingLink
from detector.paging.metrics import PageMetrics
from detector.paging.pagerduty import MAX_SUMMARY, PagerDutySink, dedup_key
from detector.paging.state import Action, Delivery
from detector.paging.webhook import LINK_HEADER, SIGNATURE_HEADER, WebhookSink, sign, verify
from detector.testing.pagerduty import PagerDutyReceiver, validate
from tests.unit.test_paging_state import REVS

T0 = datetime(2026, 7, 26, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)
KEY = "R0UT1NGKEY0123456789abcdefABCDEF"


def delivery(
    finding: Finding,
    sink: SinkName,
    action: Action,
    previous: Sent | None = None,
    revision_at: datetime = T0 + timedelta(minutes=1),
) -> Delivery:
    return Delivery(sink, action, finding, 0, T0, revision_at, previous)


def sent(finding: Finding) -> Sent:
    from detector.paging.state import condition_of  # noqa: PLC0415

    return Sent(
        revision=finding.revision,
        status=finding.status,
        severity=finding.severity,
        condition=condition_of(finding),
        outcome="accepted",
        at=T0,
    )


# ---- Alertmanager -----------------------------------------------------------------------------


def test_an_open_finding_is_one_alert_with_its_labels_and_annotations() -> None:
    am = AlertmanagerSink("http://127.0.0.1:9093")
    (alert,) = am.alerts(delivery(REVS[3], SinkName.ALERTMANAGER, Action.FIRE), NOW)
    assert alert["labels"] == {
        "alertname": "SplitbrainFinding",
        "severity": "page",
        "finding_id": REVS[3].finding_id,
        "workflow_key": "export-ledger",
        "condition": "duplicate_effect",
    }
    notes = alert["annotations"]
    assert set(notes) == {"summary", "witness", "response", "runbook_url", "context"}
    assert notes["context"] == (
        "displaced owner (epoch 17): tool_class=export; current owner (epoch 18): tool_class=export"
    )
    assert "\n" not in notes["summary"]
    assert notes["summary"].startswith("CRITICAL split-brain in export-ledger: epoch 17")
    assert "worker-alpha lost epoch 17 to a takeover at seq 5" in notes["witness"]
    assert notes["response"] == REVS[3].response
    assert notes["runbook_url"] == "docs/operating/alerts.md#splitbrainfinding"
    assert alert["startsAt"] == "2026-07-26T10:00:00.000Z"
    assert "endsAt" not in alert


def test_labels_that_change_end_the_alert_under_the_old_ones() -> None:
    am = AlertmanagerSink("http://am")
    fire = delivery(REVS[2], SinkName.ALERTMANAGER, Action.FIRE, previous=sent(REVS[1]))
    new, old = am.alerts(fire, NOW)
    assert (new["labels"]["severity"], new["labels"]["condition"]) == (
        "page",
        "stale_effect_committed",
    )
    assert "endsAt" not in new
    assert (old["labels"]["severity"], old["labels"]["condition"]) == (
        "ticket",
        "stale_effect_attempt",
    )
    assert old["endsAt"] == "2026-07-26T10:05:00.000Z"


def test_a_resolved_finding_ends_its_alert_when_it_resolved() -> None:
    am = AlertmanagerSink("http://am")
    resolve = delivery(REVS[4], SinkName.ALERTMANAGER, Action.RESOLVE, previous=sent(REVS[3]))
    (alert,) = am.alerts(resolve, NOW)
    assert alert["labels"]["severity"] == "page"
    assert alert["endsAt"] == "2026-07-26T10:01:00.000Z"
    # Never in the future (a clock ahead of this one), never before startsAt.
    late = delivery(
        REVS[4], SinkName.ALERTMANAGER, Action.RESOLVE, sent(REVS[3]), NOW + timedelta(hours=1)
    )
    assert am.alerts(late, NOW)[0]["endsAt"] == "2026-07-26T10:05:00.000Z"


def test_the_endpoint_is_api_v2_alerts() -> None:
    assert endpoint("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert endpoint("http://am:9093/prefix/") == "http://am:9093/prefix/api/v2/alerts"
    assert endpoint("http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"


# ---- PagerDuty --------------------------------------------------------------------------------


def test_a_trigger_follows_the_events_v2_schema() -> None:
    pd = PagerDutySink(SecretStr(KEY), "http://pd/v2/enqueue")
    event = pd.event(delivery(REVS[3], SinkName.PAGERDUTY, Action.TRIGGER))
    assert validate(event, KEY) == []
    assert (event["event_action"], event["dedup_key"]) == ("trigger", REVS[3].finding_id)
    payload = event["payload"]
    assert (payload["severity"], payload["source"]) == ("critical", "export-ledger")
    details = payload["custom_details"]
    assert details["witness"].startswith("worker-alpha lost epoch 17")
    assert details["response"] == REVS[3].response
    assert (details["displaced_epoch"], details["current_epoch"]) == (17, 18)
    assert details["epochs"] == [17, 18]
    assert details["effect_keys"] == ["release-index/2026-07-26"]


@pytest.mark.parametrize(("ours", "theirs"), [(0, "info"), (1, "warning"), (2, "critical")])
def test_severities_map_one_to_one(ours: int, theirs: str) -> None:
    pd = PagerDutySink(SecretStr(KEY))
    finding = REVS[ours]
    assert pd.event(delivery(finding, SinkName.PAGERDUTY, Action.TRIGGER))["payload"][
        "severity"
    ] == (theirs)


def test_a_resolve_is_the_key_and_the_dedup_key() -> None:
    pd = PagerDutySink(SecretStr(KEY))
    event = pd.event(delivery(REVS[4], SinkName.PAGERDUTY, Action.RESOLVE))
    assert event == {
        "routing_key": KEY,
        "event_action": "resolve",
        "dedup_key": REVS[4].finding_id,
    }
    assert validate(event, KEY) == []


def test_long_strings_stay_within_pagerdutys_limits() -> None:
    long = REVS[3].model_copy(update={"workflow_key": "w" * 1100, "finding_id": "f" * 300})
    event = PagerDutySink(SecretStr(KEY)).event(delivery(long, SinkName.PAGERDUTY, Action.TRIGGER))
    assert validate(event, KEY) == []
    assert len(event["payload"]["summary"]) == MAX_SUMMARY
    assert len(event["dedup_key"]) <= 255
    assert event["dedup_key"] == dedup_key("f" * 300) != "f" * 300


def test_the_receiver_refuses_what_pagerduty_refuses() -> None:
    good = PagerDutySink(SecretStr(KEY)).event(
        delivery(REVS[0], SinkName.PAGERDUTY, Action.TRIGGER)
    )
    assert validate(good, KEY) == []
    assert validate(good, "another-key") == ["routing_key: not a known integration key"]
    bad: list[tuple[dict[str, Any], str]] = [
        ({**good, "event_action": "open"}, "event_action"),
        ({**good, "dedup_key": "d" * 256}, "dedup_key"),
        ({**good, "payload": {**good["payload"], "summary": "s" * 1025}}, "payload.summary"),
        ({**good, "payload": {**good["payload"], "severity": "page"}}, "payload.severity"),
        ({**good, "payload": {**good["payload"], "source": ""}}, "payload.source"),
        ({k: v for k, v in good.items() if k != "payload"}, "payload"),
        ({"routing_key": KEY, "event_action": "resolve"}, "dedup_key: required"),
    ]
    for event, error in bad:
        assert any(e.startswith(error) for e in validate(event)), (error, validate(event))


def test_the_receiver_answers_on_demand_and_keeps_incidents() -> None:
    with PagerDutyReceiver(KEY) as pd:
        trigger = PagerDutySink(SecretStr(KEY), pd.url).request(
            delivery(REVS[3], SinkName.PAGERDUTY, Action.TRIGGER), NOW
        )
        pd.fail_next(429)
        pd.fail_next(500)
        assert [post(trigger, 5).status for _ in range(4)] == [429, 500, 202, 202]
        incident = pd.incident(REVS[3].finding_id)
        assert incident is not None
        assert (incident.status, incident.opened, len(incident.events)) == ("triggered", 1, 2)
        huge = json.dumps({**json.loads(trigger.body), "padding": "x" * 600_000}).encode()
        answer = post(Request(pd.url, huge), 5)
        assert (answer.outcome, answer.status) == (DeliveryOutcome.DEAD_LETTER, 400)
        assert "more than 524288" in answer.detail


# ---- the webhook ------------------------------------------------------------------------------


def test_the_webhook_posts_the_revision_signed() -> None:
    hook = WebhookSink("http://hook", SecretStr("s3cret"))
    req = hook.request(delivery(REVS[2], SinkName.WEBHOOK, Action.POST), NOW)
    assert json.loads(req.body) == json.loads(REVS[2].to_json())
    assert req.headers[SIGNATURE_HEADER] == sign(b"s3cret", req.body)
    assert verify(b"s3cret", req.body, req.headers[SIGNATURE_HEADER])
    assert not verify(b"other", req.body, req.headers[SIGNATURE_HEADER])
    assert not verify(b"s3cret", req.body + b" ", req.headers[SIGNATURE_HEADER])
    assert req.headers["Idempotency-Key"] == f"{REVS[2].finding_id}/3"
    unsigned = WebhookSink("http://hook").request(
        delivery(REVS[2], SinkName.WEBHOOK, Action.POST), NOW
    )
    assert SIGNATURE_HEADER not in unsigned.headers


def test_a_finding_id_that_cannot_be_a_header_is_hashed_there() -> None:
    odd = REVS[0].model_copy(update={"finding_id": "sb-\u00e9\r\nX-Injected: 1"})
    req = WebhookSink("http://hook").request(delivery(odd, SinkName.WEBHOOK, Action.POST), NOW)
    assert req.headers["X-Splitbrain-Finding-Id"].startswith("sha256-")


# ---- delivery ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, DeliveryOutcome.ACCEPTED),
        (202, DeliveryOutcome.ACCEPTED),
        (429, DeliveryOutcome.RETRIED),
        (408, DeliveryOutcome.RETRIED),
        (500, DeliveryOutcome.RETRIED),
        (503, DeliveryOutcome.RETRIED),
        (400, DeliveryOutcome.DEAD_LETTER),
        (401, DeliveryOutcome.DEAD_LETTER),
        (404, DeliveryOutcome.DEAD_LETTER),
        (413, DeliveryOutcome.DEAD_LETTER),
        (302, DeliveryOutcome.DEAD_LETTER),
    ],
)
def test_statuses(status: int, outcome: DeliveryOutcome) -> None:
    assert classify(status) is outcome


def test_backoff_grows_with_jitter_up_to_its_maximum() -> None:
    backoff = Backoff(initial=1.0, maximum=8.0)
    rng = random.Random(7)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (30, 8.0)]:
        waits = [backoff.delay(attempt, rng) for _ in range(200)]
        assert all(cap / 2 <= w <= cap for w in waits), (attempt, min(waits), max(waits))
        assert max(waits) - min(waits) > cap / 4  # jittered, not one value
    assert backoff.delay(1, rng, retry_after=30.0) == 30.0


def test_a_sink_down_for_days_is_still_retried_at_the_maximum() -> None:
    """Doubling past a float's range raised OverflowError at a delivery's 1025th retry."""
    backoff = Backoff(initial=1.0, maximum=8.0)
    assert 4.0 <= backoff.delay(1025, random.Random(7)) <= 8.0
    assert 4.0 <= backoff.delay(10**6, random.Random(7)) <= 8.0


def test_log_lines_carry_no_credentials() -> None:
    assert origin("https://user:pw@hooks.example.com:8443/x/y?token=abc") == (
        "https://hooks.example.com:8443"
    )
    assert redact("bad key R0UT1NG in body", ["R0UT1NG", ""]) == "bad key *** in body"


class _Server:
    """Answers each POST with the next (status, headers, body) of `script`."""

    def __init__(self, script: list[tuple[int, dict[str, str], bytes]]) -> None:
        self.bodies: list[bytes] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                status, headers, body = script.pop(0)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        outer = self
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    s = _Server(list(request.param))
    yield s
    s.server.shutdown()
    s.server.server_close()


@pytest.mark.parametrize(
    "server",
    [
        [
            (202, {}, b"{}"),
            (429, {"Retry-After": "3"}, b"slow down"),
            (503, {}, b""),
            (400, {}, b'{"errors": ["payload.summary: required"]}'),
            (302, {"Location": "/elsewhere"}, b""),
        ]
    ],
    indirect=True,
)
def test_post_says_what_an_answer_means(server: _Server) -> None:
    req = Request(server.url, b'{"a": 1}', {"Content-Type": "application/json"})
    answers = [post(req, 5) for _ in range(5)]
    assert [(a.outcome, a.status) for a in answers] == [
        (DeliveryOutcome.ACCEPTED, 202),
        (DeliveryOutcome.RETRIED, 429),
        (DeliveryOutcome.RETRIED, 503),
        (DeliveryOutcome.DEAD_LETTER, 400),
        (DeliveryOutcome.DEAD_LETTER, 302),  # a POST is not silently redirected to a GET
    ]
    assert answers[1].retry_after == 3.0
    assert "payload.summary: required" in answers[3].detail
    assert server.bodies == [b'{"a": 1}'] * 5


def test_no_answer_is_retried() -> None:
    answer = post(Request(f"http://127.0.0.1:{free_port()}/", b"{}"), 2)
    assert (answer.outcome, answer.status) == (DeliveryOutcome.RETRIED, None)
    assert answer.detail.startswith("no answer")


# ---- metrics ----------------------------------------------------------------------------------


def test_metrics_are_bounded_and_exported_from_the_start() -> None:
    metrics = PageMetrics([SinkName.ALERTMANAGER, SinkName.PAGERDUTY], CollectorRegistry())
    metrics.answered(SinkName.PAGERDUTY, DeliveryOutcome.ACCEPTED, 0.3)
    metrics.consumer_lag(4, 12)
    metrics.consumer_lag(5, None)  # never reported: nothing to remove
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }
    names = {name for name, _ in samples}
    assert all(name.startswith("splitbrain_page_") for name in names)
    for sink in ("alertmanager", "pagerduty"):
        for outcome in ("accepted", "retried", "dead_letter"):
            key = ("splitbrain_page_deliveries_total", (("outcome", outcome), ("sink", sink)))
            assert key in samples
    assert samples[("splitbrain_page_consumer_lag_records", (("partition", "4"),))] == 12
    assert samples[("splitbrain_page_delivery_latency_seconds_count", (("sink", "pagerduty"),))]
    labels = {k for _, ls in samples for k, _ in ls}
    assert labels <= {"sink", "outcome", "severity", "partition", "le"}


# ---- the link to the finding ------------------------------------------------------------------

LINK = FindingLink("https://sb.example/findings/{finding_id}")


def test_every_sink_carries_the_link_to_its_finding() -> None:
    f = REVS[3]
    url = f"https://sb.example/findings/{f.finding_id}"
    (alert,) = AlertmanagerSink("http://am", link=LINK).alerts(
        delivery(f, SinkName.ALERTMANAGER, Action.FIRE), NOW
    )
    assert (alert["generatorURL"], alert["annotations"]["finding_url"]) == (url, url)
    event = PagerDutySink(SecretStr(KEY), link=LINK).event(
        delivery(f, SinkName.PAGERDUTY, Action.TRIGGER)
    )
    assert event["links"] == [{"href": url, "text": "the finding"}]
    assert validate(event, KEY) == []
    req = WebhookSink("http://hook", link=LINK).request(
        delivery(f, SinkName.WEBHOOK, Action.POST), NOW
    )
    assert req.headers[LINK_HEADER] == url
    (plain,) = AlertmanagerSink("http://am").alerts(
        delivery(f, SinkName.ALERTMANAGER, Action.FIRE), NOW
    )
    assert "generatorURL" not in plain and "finding_url" not in plain["annotations"]


def test_a_finding_id_cannot_leave_its_place_in_the_link() -> None:
    assert LINK.of("sb-1/../admin?x=1#y\r\n") == (
        "https://sb.example/findings/sb-1%2F..%2Fadmin%3Fx%3D1%23y%0D%0A"
    )


@pytest.mark.parametrize(
    "template",
    ["https://sb.example/findings/", "ftp://sb.example/{finding_id}", "https://u:p@h/{finding_id}"],
)
def test_a_link_template_must_be_a_url_holding_the_id_once(template: str) -> None:
    with pytest.raises(ValueError):
        FindingLink(template)
