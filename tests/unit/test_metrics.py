"""Worker metrics count what a read_committed reader sees: work of committed transactions."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from detector.contracts.events import OPTIONAL_FIELDS, parse_event_json
from detector.contracts.findings import Finding, Severity, Status
from detector.core import Counters, FindingUpdate
from detector.telemetry.metrics import WorkerMetrics


def finding(
    revision: int, severity: Severity = Severity.CRITICAL, *, escalated: bool | None = None
) -> FindingUpdate:
    """A revision as the engine publishes it; by default only the first one escalates."""
    doc = Finding.model_validate(
        {
            "finding_id": "sb-1",
            "revision": revision,
            "status": Status.OPEN,
            "severity": severity,
            "workflow_key": "wf",
            "displaced": None,
            "current": None,
            "transition": None,
            "conditions": [],
            "last_stale_event": None,
            "effect_keys": [],
            "sink_outcome": "none",
            "ordering": "arrival",
            "confidence": "low",
            "evidence_lag": None,
            "response": "",
        }
    )
    return FindingUpdate(doc, revision == 1 if escalated is None else escalated)


def value(m: WorkerMetrics, name: str, **labels: str) -> float:
    sample = m.registry.get_sample_value(name, labels)
    assert sample is not None, (name, labels)
    return sample


def opened_critical(m: WorkerMetrics) -> float:
    return value(m, "splitbrain_findings_opened_total", severity="critical")


def test_nothing_counts_before_its_transaction_commits() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.event("heartbeat", 0)
    m.dead_letter("too_large", 0)
    m.finding_revision(finding(1), 0)
    assert opened_critical(m) == 0
    assert value(m, "splitbrain_dlq_messages_total", reason="too_large") == 0
    m.committed(0.02, 3)
    assert value(m, "splitbrain_events_total", kind="heartbeat") == 1
    assert value(m, "splitbrain_dlq_messages_total", reason="too_large") == 1
    assert opened_critical(m) == 1
    assert value(m, "splitbrain_finding_revisions_total", severity="critical", status="open") == 1
    assert value(m, "splitbrain_transactions_total", outcome="committed") == 1
    assert value(m, "splitbrain_transaction_events_sum") == 3


def test_an_aborted_batch_done_again_is_counted_once() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.finding_revision(finding(1), 0)
    m.aborted()
    m.finding_revision(finding(1), 0)  # the same batch, processed again after the abort
    m.committed(0.02, 1)
    assert opened_critical(m) == 1
    assert value(m, "splitbrain_transactions_total", outcome="aborted") == 1


def test_a_commit_of_some_partitions_counts_only_their_work() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.finding_revision(finding(1), 0)
    m.finding_revision(finding(1, Severity.WARNING), 1)
    m.finding_revision(finding(2), 2)
    m.committed(0.01, 1, partitions=[0])
    assert opened_critical(m) == 1
    assert value(m, "splitbrain_findings_opened_total", severity="warning") == 0
    m.revoked([1])  # its next owner does that work again
    m.committed(0.01, 1)
    assert value(m, "splitbrain_findings_opened_total", severity="warning") == 0
    assert value(m, "splitbrain_finding_revisions_total", severity="critical", status="open") == 2


def test_engine_counts_become_increments_and_restart_with_a_fresh_engine() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.engine(0, Counters(activity_dropped=5, effects_dropped=1, evicted_idle=2))
    m.engine(0, Counters(activity_dropped=7, effects_dropped=1, evicted_idle=2))
    assert value(m, "splitbrain_state_evidence_dropped_total", **{"class": "activity"}) == 7
    assert value(m, "splitbrain_state_evidence_dropped_total", **{"class": "effect"}) == 1
    m.engine_replaced(0)
    m.engine(0, Counters(activity_dropped=1))
    assert value(m, "splitbrain_state_evidence_dropped_total", **{"class": "activity"}) == 8
    assert value(m, "splitbrain_state_evictions_total", cause="idle") == 2


def test_lag_is_per_assigned_partition_and_gone_with_the_partition() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.consumer_lag(0, 120)
    m.consumer_lag(1, 0)
    assert value(m, "splitbrain_consumer_lag_records", partition="0") == 120
    m.consumer_lag(0, -3)  # an end offset cached before the last fetch: never negative
    assert value(m, "splitbrain_consumer_lag_records", partition="0") == 0
    m.consumer_lag(1, None)  # revoked: a frozen value would page for a partition not ours
    assert (
        m.registry.get_sample_value("splitbrain_consumer_lag_records", {"partition": "1"}) is None
    )
    m.consumer_lag(7, None)  # never reported: nothing to remove, no error


def test_last_poll_is_a_unix_timestamp() -> None:
    m = WorkerMetrics(CollectorRegistry())
    assert value(m, "splitbrain_worker_last_poll_timestamp_seconds") == 0
    m.polled(1_764_512_000.5)
    assert value(m, "splitbrain_worker_last_poll_timestamp_seconds") == 1_764_512_000.5


def test_a_finding_raised_to_critical_counts_as_reaching_critical_not_as_opened_critical() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.finding_revision(finding(1, Severity.INFO), 0)
    m.finding_revision(finding(2, Severity.CRITICAL, escalated=True), 0)
    m.finding_revision(finding(3, Severity.CRITICAL), 0)  # more evidence, still critical
    m.committed(0.01, 3)
    assert opened_critical(m) == 0
    assert value(m, "splitbrain_findings_opened_total", severity="info") == 1
    assert value(m, "splitbrain_findings_escalated_total", severity="info") == 1
    assert value(m, "splitbrain_findings_escalated_total", severity="critical") == 1
    assert value(m, "splitbrain_finding_revisions_total", severity="critical", status="open") == 2


def test_open_findings_per_partition_and_severity_and_gone_with_the_partition() -> None:
    m = WorkerMetrics(CollectorRegistry())
    counts = dict.fromkeys(Severity, 0) | {Severity.CRITICAL: 2}
    m.findings_open(3, counts)
    assert value(m, "splitbrain_findings_open", partition="3", severity="critical") == 2
    assert value(m, "splitbrain_findings_open", partition="3", severity="info") == 0
    m.findings_open(3, None)
    gone = m.registry.get_sample_value(
        "splitbrain_findings_open", {"partition": "3", "severity": "critical"}
    )
    assert gone is None


def test_a_partition_that_leaves_takes_its_gauges_with_it() -> None:
    m = WorkerMetrics(CollectorRegistry())
    m.state(2, 40)
    m.consumer_lag(2, 7)
    m.findings_open(2, dict.fromkeys(Severity, 1))
    m.partition_gone(2)
    assert value(m, "splitbrain_state_workflows", partition="2") == 0
    for name, labels in (
        ("splitbrain_consumer_lag_records", {"partition": "2"}),
        ("splitbrain_findings_open", {"partition": "2", "severity": "critical"}),
    ):
        assert m.registry.get_sample_value(name, labels) is None, name


def test_dropped_optional_fields_count_by_field_when_their_transaction_commits() -> None:
    m = WorkerMetrics(CollectorRegistry())
    event = parse_event_json(
        b'{"event_id": "e", "kind": "heartbeat", "workflow_key": "wf", "owner_epoch": 1, '
        b'"worker_id": "w", "observed_at": "2026-07-26T10:00:00", "trace_id": "UPPER"}'
    )
    m.fields_dropped(event, 0)
    assert value(m, "splitbrain_event_fields_dropped_total", field="observed_at") == 0
    m.committed(0.01, 1)
    assert value(m, "splitbrain_event_fields_dropped_total", field="observed_at") == 1
    assert value(m, "splitbrain_event_fields_dropped_total", field="trace_id") == 1
    m.fields_dropped(parse_event_json(event.model_dump_json()), 0)  # a valid event: nothing
    m.committed(0.01, 1)
    assert value(m, "splitbrain_event_fields_dropped_total", field="observed_at") == 1


def test_every_optional_field_is_exported_at_zero_and_nothing_else_is_a_label() -> None:
    m = WorkerMetrics(CollectorRegistry())
    labels = {
        s.labels["field"]
        for family in m.registry.collect()
        for s in family.samples
        if s.name == "splitbrain_event_fields_dropped_total"
    }
    assert labels == set(OPTIONAL_FIELDS)
    assert {"seq", "observed_at", "attrs", "trace_id", "request"} <= labels
    assert not labels & {"event_id", "kind", "workflow_key", "owner_epoch", "worker_id"}
