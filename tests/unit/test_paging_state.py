"""The pager bridge's decisions (`detector.paging.state`), on the revisions the engine really
publishes for the acceptance history: what each sink is sent, when, and what is remembered."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from detector import Config, Detector, parse_event_json
from detector.contracts.findings import Finding, Severity, Status
from detector.contracts.page_state import PageStateRecord, SinkName
from detector.paging.state import (
    Action,
    Delivery,
    PageState,
    SinkPolicy,
    condition_of,
)
from tests.paths import ROOT, SEED_FIXTURE

AM, PD, WH = SinkName.ALERTMANAGER, SinkName.PAGERDUTY, SinkName.WEBHOOK
T0 = datetime(2026, 7, 26, 10, 0, tzinfo=UTC)
# What resolves the acceptance history's finding (DESIGN §4): the displaced epoch 17 knows it
# lost (lease_lost at or after its last stale event, seq 8) and a verifier confirms the one
# affected effect key after its latest condition (the duplicate at seq 9).
RESOLUTION = [
    {
        "event_id": "e17",
        "seq": 17,
        "kind": "lease_lost",
        "workflow_key": "export-ledger",
        "owner_epoch": 17,
        "worker_id": "worker-alpha",
    },
    {
        "event_id": "e18",
        "seq": 18,
        "kind": "outcome_verified",
        "workflow_key": "export-ledger",
        "owner_epoch": 18,
        "worker_id": "verifier",
        "source": "verifier",
        "effect_key": "release-index/2026-07-26",
    },
]


def revisions() -> list[Finding]:
    """Every revision the engine publishes for the acceptance history, then its resolution:
    info, warning, critical, critical + duplicate, resolved."""
    detector = Detector(Config.for_audit())
    lines = [line for line in SEED_FIXTURE.read_text().splitlines() if line.strip()]
    lines += [json.dumps(event) for event in RESOLUTION]
    return [u.finding for line in lines for u in detector.observe(parse_event_json(line))]


REVS = revisions()


def state(**min_severity: Severity) -> PageState:
    return PageState({s: SinkPolicy(min_severity.get(s.value, Severity.INFO)) for s in SinkName})


def feed(s: PageState, *findings: Finding, at: datetime = T0) -> list[Delivery]:
    for i, f in enumerate(findings):
        s.observe(f, 2, at + timedelta(seconds=i))
    return s.plan()


def accept(s: PageState, deliveries: list[Delivery], at: datetime = T0) -> None:
    for d in deliveries:
        s.done(d, "accepted", at)


def actions(deliveries: list[Delivery]) -> dict[SinkName, Action]:
    assert len({d.sink for d in deliveries}) == len(deliveries), deliveries
    return {d.sink: d.action for d in deliveries}


def test_the_acceptance_history_revision_by_revision() -> None:
    assert [(f.revision, f.status, f.severity) for f in REVS] == [
        (1, Status.OPEN, Severity.INFO),
        (2, Status.OPEN, Severity.WARNING),
        (3, Status.OPEN, Severity.CRITICAL),
        (4, Status.OPEN, Severity.CRITICAL),
        (5, Status.RESOLVED, Severity.CRITICAL),
    ]
    s = state()
    seen = []
    for f in REVS:
        planned = feed(s, f)
        seen.append(actions(planned))
        accept(s, planned)
    assert seen == [
        {AM: Action.FIRE, PD: Action.TRIGGER, WH: Action.POST},  # opens at info
        {AM: Action.FIRE, PD: Action.TRIGGER, WH: Action.POST},  # escalates to warning
        {AM: Action.FIRE, PD: Action.TRIGGER, WH: Action.POST},  # escalates to critical
        # A duplicate at the same severity: new annotations and condition for Alertmanager and a
        # new revision for the webhook, nothing PagerDuty shows.
        {AM: Action.FIRE, WH: Action.POST},
        {AM: Action.RESOLVE, PD: Action.RESOLVE, WH: Action.POST},
    ]
    assert [condition_of(f) for f in REVS] == [
        "stale_activity",
        "stale_effect_attempt",
        "stale_effect_committed",
        "duplicate_effect",
        "duplicate_effect",
    ]


def test_revisions_read_together_are_sent_once_at_the_latest() -> None:
    s = state()
    planned = feed(s, *REVS[:4])
    assert actions(planned) == {AM: Action.FIRE, PD: Action.TRIGGER, WH: Action.POST}
    assert {d.finding.revision for d in planned} == {4}
    assert {d.first_seen for d in planned} == {T0}  # startsAt: the first revision's timestamp
    assert {d.revision_at for d in planned} == {T0 + timedelta(seconds=3)}


def test_a_finding_that_opened_and_resolved_unseen_is_announced_nowhere() -> None:
    s = state()
    assert feed(s, *REVS) == []
    assert feed(s, REVS[-1]) == []
    assert s.open_counts() == {}


def test_an_older_or_repeated_revision_changes_nothing() -> None:
    s = state()
    accept(s, feed(s, REVS[2]))
    assert not s.observe(REVS[2], 2, T0)
    assert not s.observe(REVS[0], 2, T0)
    assert s.plan() == []


def test_a_sink_hears_of_a_finding_from_its_minimum_severity() -> None:
    s = state(pagerduty=Severity.CRITICAL, webhook=Severity.WARNING)
    got = []
    for f in REVS:
        planned = feed(s, f)
        got.append({k: v for k, v in actions(planned).items() if k is not AM})
        accept(s, planned)
    assert got == [
        {},
        {WH: Action.POST},
        {PD: Action.TRIGGER, WH: Action.POST},
        {WH: Action.POST},
        {PD: Action.RESOLVE, WH: Action.POST},
    ]


def test_a_sink_that_never_took_the_finding_is_not_sent_its_resolution() -> None:
    s = state(pagerduty=Severity.CRITICAL)
    accept(s, feed(s, REVS[1]))  # warning: not for PagerDuty
    assert actions(feed(s, REVS[4])) == {AM: Action.RESOLVE, WH: Action.POST}


def test_a_reopened_finding_is_triggered_again() -> None:
    s = state()
    accept(s, feed(s, REVS[3]))
    accept(s, feed(s, REVS[4]))
    reopened = REVS[3].model_copy(update={"revision": 6})
    assert actions(feed(s, reopened)) == {AM: Action.FIRE, PD: Action.TRIGGER, WH: Action.POST}


def test_alertmanager_is_told_the_labels_it_holds_when_they_change() -> None:
    s = state()
    accept(s, feed(s, REVS[1]))
    (fire,) = [d for d in feed(s, REVS[2]) if d.sink is AM]
    assert fire.previous is not None
    assert (fire.previous.severity, fire.previous.condition) == (
        Severity.WARNING,
        "stale_effect_attempt",
    )


def test_a_dead_letter_is_not_resent_but_the_next_change_is_tried() -> None:
    s = state()
    planned = feed(s, REVS[0])
    for d in planned:
        s.done(d, "dead_letter" if d.sink is AM else "accepted", T0)
    assert s.plan() == []
    assert s.resend(AM) == []
    assert actions(feed(s, REVS[1]))[AM] is Action.FIRE


def test_resend_is_the_open_findings_alertmanager_took_at_their_latest_revision() -> None:
    s = state()
    accept(s, feed(s, REVS[1]))
    assert [e.finding.revision for e in s.resend(AM)] == [2]
    s.observe(REVS[2], 2, T0)  # a change not delivered yet: its delivery fires it
    assert s.resend(AM) == []
    accept(s, s.plan())
    assert [e.finding.revision for e in s.resend(AM)] == [3]
    accept(s, feed(s, REVS[4]))
    assert s.resend(AM) == []


def test_restored_state_sends_only_what_a_sink_had_not_taken() -> None:
    s = state()
    planned = feed(s, REVS[2])
    accept(s, [d for d in planned if d.sink is not PD])  # the bridge died before PagerDuty took it
    records = s.take_unsaved()
    assert [(fid, p) for fid, p, _ in records] == [(REVS[2].finding_id, 2)]
    (_, _, record) = records[0]
    assert record is not None

    again = state()
    again.restore(PageStateRecord.model_validate_json(record.to_json()), 2)
    assert actions(again.plan()) == {PD: Action.TRIGGER}
    assert not again.observe(REVS[2], 2, T0)  # the findings topic read again from older offsets
    assert again.plan() == []


def test_resolved_findings_are_remembered_for_the_retention_then_tombstoned() -> None:
    s = state()
    accept(s, feed(s, REVS[3]))
    s.observe(REVS[4], 2, T0 + timedelta(minutes=1))
    day = timedelta(days=1)
    assert s.expire(T0 + 30 * day, day) == []  # its resolution is not delivered yet
    accept(s, s.plan())
    s.take_unsaved()
    assert s.expire(T0 + timedelta(hours=1), day) == []
    assert s.expire(T0 + 2 * day, day) == [(REVS[4].finding_id, 2)]
    assert s.take_unsaved() == [(REVS[4].finding_id, 2, None)]
    assert s.entries == {}


def test_open_findings_are_never_expired() -> None:
    s = state()
    accept(s, feed(s, REVS[3]))
    assert s.expire(T0 + timedelta(days=400), timedelta(0)) == []
    assert s.open_counts() == {Severity.CRITICAL: 1}


def test_revoked_partitions_are_forgotten_without_tombstones() -> None:
    s = state()
    s.observe(REVS[0], 1, T0)
    s.observe(REVS[0].model_copy(update={"finding_id": "other"}), 2, T0)
    s.drop_partitions([1])
    assert list(s.entries) == ["other"]
    assert [fid for fid, _, _ in s.take_unsaved()] == ["other"]


def test_a_tombstone_read_back_forgets_the_finding() -> None:
    s = state()
    s.observe(REVS[0], 0, T0)
    s.forget(REVS[0].finding_id)
    assert s.plan() == []
    assert s.entries == {}


# ---- the state topic's contract (its JSON Schema is checked by test_schemas.py) -------------


def test_a_state_record_round_trips_and_ignores_unknown_fields() -> None:
    s = state()
    accept(s, feed(s, REVS[3]))
    ((_, _, record),) = s.take_unsaved()
    assert record is not None
    doc = json.loads(record.to_json())
    assert doc["schema"] == "splitbrain.page-state/v1"
    assert set(doc["sent"]) == {"alertmanager", "pagerduty", "webhook"}
    assert doc["sent"]["pagerduty"]["revision"] == 4
    doc["added_later"] = 1
    doc["sent"]["webhook"]["added_later"] = 1
    assert PageStateRecord.model_validate_json(json.dumps(doc)) == record


def test_the_schema_file_names_its_contract() -> None:
    doc = json.loads((ROOT / "topics" / "schemas" / "page-state.v1.schema.json").read_text())
    assert doc["properties"]["schema"]["const"] == "splitbrain.page-state/v1"
