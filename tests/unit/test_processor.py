"""The processing step both runtimes share, with no broker: what it asks them to write."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from detector.core import Config, Detector
from detector.runtime.processor import TICK_EVERY_S, PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics
from tests.paths import SEED_FIXTURE

TOPIC = "agent.ownership.v1"


def processor(quiet_period_s: float = 600.0) -> PartitionProcessor:
    detector = Detector(Config(quiet_period_s=quiet_period_s))
    return PartitionProcessor(3, detector, WorkerMetrics(CollectorRegistry()))


def records(path: Path = SEED_FIXTURE) -> list[tuple[bytes, bytes]]:
    out = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            key = line.split(b'"workflow_key": "')[1].split(b'"')[0]
            out.append((key, line))
    return out


def sample(p: PartitionProcessor, name: str, **labels: str) -> float:
    return p.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_record_gives_its_revisions_and_the_workflow_to_persist() -> None:
    p = processor()
    outcomes = [p.process(k, v, TOPIC, i, now=100.0) for i, (k, v) in enumerate(records())]
    revisions = [u.finding for o in outcomes for u in o.findings]
    assert [(f.workflow_key, f.revision, f.severity.value) for f in revisions][-1] == (
        "export-ledger",
        4,
        "critical",
    )
    assert all(o.dead_letter is None for o in outcomes)
    assert {w for o in outcomes for w in o.changed} == {
        "export-ledger",
        "report-index",
        "checkout-sync",
    }


def test_a_bad_record_is_a_dead_letter_with_its_reason_and_nothing_else() -> None:
    p = processor()
    outcome = p.process(b"wf", b'{"kind": "heartbeat"}', TOPIC, 7, now=1.0)
    assert outcome.dead_letter is not None
    assert outcome.dead_letter.reason.startswith("invalid")
    assert (outcome.dead_letter.partition, outcome.dead_letter.offset) == (3, 7)
    assert (outcome.findings, outcome.changed) == ([], set())
    p.metrics.committed(0.01, 1)  # counted when the transaction commits
    assert sample(p, "splitbrain_dlq_messages_total", reason="invalid") == 1


def test_an_invalid_optional_field_is_counted_and_the_event_kept() -> None:
    p = processor()
    value = (
        b'{"event_id": "e1", "kind": "lease_acquired", "workflow_key": "wf", '
        b'"owner_epoch": 1, "worker_id": "w", "lease_duration_s": 0}'
    )
    outcome = p.process(b"wf", value, TOPIC, 0, now=1.0)
    assert outcome.dead_letter is None and outcome.changed == {"wf"}
    p.metrics.committed(0.01, 1)
    assert sample(p, "splitbrain_event_fields_dropped_total", field="lease_duration_s") == 1


def test_unreadable_optional_parts_are_counted_by_field_and_unknown_ones_not_at_all() -> None:
    """DESIGN §3: a `detail` nested deeper than the parser allows, an unpaired surrogate in
    `attrs`, a boolean lease duration each cost only their field, counted under its name; an
    unknown field is ignored whatever it holds, under no label (its name is unbounded)."""
    p = processor()
    deep = b'{"n": ' * 300 + b"1" + b"}" * 300
    head = (
        b'{"event_id": "e1", "kind": "lease_acquired", "workflow_key": "wf", '
        b'"owner_epoch": 1, "worker_id": "w"'
    )
    members = [
        b'"detail": ' + deep,
        b'"attrs": {"model": "\\ud800"}',
        b'"lease_duration_s": true',
        b'"unknown_%d": ' + deep,
        b'"detail": {"n": 1, "n": 2}',
    ]
    for offset, member in enumerate(members):
        value = (
            head.replace(b'"e1"', b'"e%d"' % offset)
            + b", "
            + member.replace(b"%d", b"%d" % offset)
            + b"}"
        )
        outcome = p.process(b"wf", value, TOPIC, offset, now=1.0)
        assert outcome.dead_letter is None, member
    p.metrics.committed(0.01, len(members))
    counted = {
        s.labels["field"]: s.value
        for metric in p.metrics.registry.collect()
        if metric.name == "splitbrain_event_fields_dropped"
        for s in metric.samples
        if s.name.endswith("_total") and s.value
    }
    assert counted == {"detail": 2, "attrs": 1, "lease_duration_s": 1}
    assert sample(p, "splitbrain_dlq_messages_total", reason="invalid") == 0


def event(event_id: str, kind: str, epoch: int, seq: int) -> tuple[bytes, bytes]:
    doc = {
        "event_id": event_id,
        "kind": kind,
        "workflow_key": "wf",
        "owner_epoch": epoch,
        "worker_id": f"w{epoch}",
        "seq": seq,
        # the emitter's clock is far ahead: silence is measured on the worker's
        "observed_at": "2099-01-01T00:00:00Z",
    }
    return b"wf", json.dumps(doc).encode()


def test_time_passes_on_the_worker_clock_at_most_every_tick() -> None:
    p = processor(quiet_period_s=60)
    history = [event("a1", "lease_acquired", 1, 1), event("a2", "lease_acquired", 2, 2)]
    history.append(event("p", "progress", 1, 3))  # the displaced owner still works
    for i, (k, v) in enumerate(history):
        p.process(k, v, TOPIC, i, now=1000.0)
    first = p.tick(1000.0)
    assert first is not None and first.findings == []
    assert p.tick(1000.0 + TICK_EVERY_S / 2) is None  # not due yet
    later = p.tick(1000.0 + 60)
    assert later is not None
    (resolved,) = later.findings
    assert (resolved.finding.status.value, resolved.finding.revision) == ("resolved", 2)
    assert later.changed == {"wf"}  # the new revision lives in the state: persist both


def test_each_revision_is_logged_once_with_a_hashed_workflow_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = processor()
    with caplog.at_level(logging.INFO, logger="detector.runtime.processor"):
        for i, (k, v) in enumerate(records()):
            p.process(k, v, TOPIC, i, now=1.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("finding ")]
    assert len(lines) == 4
    assert all("export-ledger" not in line and "workflow#" in line for line in lines)
