"""The checkpoint both runtimes write a transaction with, with no broker: the records it makes of
a step, the states it writes once however many records changed them, and the offsets it keeps."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from detector.core import Config, Detector, decode_state
from detector.runtime.checkpoint import Checkpoint, Record
from detector.runtime.processor import PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.test_processor import TOPIC, records

BAD = b'{"kind": "heartbeat"}'


class Local(dict[str, bytes | None]):
    """A runtime's local copy: what `put` left for each workflow."""

    def put(self, key: str, raw: bytes | None) -> None:
        self[key] = raw


def setup() -> tuple[Checkpoint, PartitionProcessor, Local]:
    processor = PartitionProcessor(3, Detector(Config()), WorkerMetrics(CollectorRegistry()))
    return Checkpoint("findings", "dlq", "changelog"), processor, Local()


def test_a_step_becomes_its_dead_letter_and_revisions_in_its_partition() -> None:
    checkpoint, p, local = setup()
    dead = p.process(b"wf", BAD, TOPIC, 7, now=1.0)
    assert dead.dead_letter is not None
    (record,) = checkpoint.take(p, local, dead)
    assert record == Record("dlq", 3, b"wf", BAD, dead.dead_letter.headers())
    produced = [
        record
        for i, (k, v) in enumerate(records())
        for record in checkpoint.take(p, local, p.process(k, v, TOPIC, i, now=100.0))
    ]
    assert {(r.topic, r.partition, r.headers) for r in produced} == {("findings", 3, None)}
    last = json.loads(produced[-1].value or b"")
    assert (produced[-1].key, last["revision"]) == (b"export-ledger", 4)


def test_each_changed_workflow_is_written_once_and_kept_locally() -> None:
    checkpoint, p, local = setup()
    for i, (k, v) in enumerate(records()):
        checkpoint.take(p, local, p.process(k, v, TOPIC, i, now=100.0))
        checkpoint.consumed(TOPIC, 3, i)
    states = checkpoint.states()
    assert {(r.topic, r.partition) for r in states} == {("changelog", 3)}
    written = {(r.key or b"").decode(): r.value for r in states}
    assert sorted(written) == ["checkout-sync", "export-ledger", "report-index"]
    for key, raw in written.items():
        assert raw is not None and raw == local[key] == p.encoded_state(key)
        assert decode_state(raw) == p.detector.states[key]
    assert checkpoint.states() == []  # written: the next commit writes only what changes again
    assert checkpoint.events == len(records())


def test_an_evicted_workflow_is_a_tombstone() -> None:
    checkpoint, p, local = setup()
    k, v = records()[0]
    checkpoint.take(p, local, p.process(k, v, TOPIC, 0, now=100.0))
    del p.detector.states[k.decode()]
    (tombstone,) = checkpoint.states()
    assert tombstone == Record("changelog", 3, k, None)
    assert local == {k.decode(): None}


def test_the_offsets_outlive_a_commit_and_go_with_their_partition() -> None:
    checkpoint, p, local = setup()
    assert not checkpoint.due(max_events=1, interval_ms=0)  # nothing open
    checkpoint.begin()
    checkpoint.consumed(TOPIC, 3, 41)
    checkpoint.consumed(TOPIC, 4, 9)
    assert checkpoint.due(max_events=2, interval_ms=60_000)
    assert not checkpoint.due(max_events=3, interval_ms=60_000)
    checkpoint.take(p, local, p.process(*records()[0], TOPIC, 42, now=1.0))
    checkpoint.end()
    assert (checkpoint.opened_at, checkpoint.events, checkpoint.states()) == (None, 0, [])
    assert checkpoint.offsets == {(TOPIC, 3): 42, (TOPIC, 4): 10}
    checkpoint.forget([(TOPIC, 4)])
    assert checkpoint.offsets == {(TOPIC, 3): 42}


def test_what_its_steps_counted_is_observed_when_it_commits_and_dropped_when_it_aborts() -> None:
    metrics = WorkerMetrics(CollectorRegistry())
    p = PartitionProcessor(3, Detector(Config()), metrics)
    checkpoint, local = Checkpoint("findings", "dlq", "changelog", metrics=metrics), Local()

    def step(offset: int) -> None:
        checkpoint.take(p, local, p.process(b"wf", BAD, TOPIC, offset, now=1.0))
        checkpoint.consumed(TOPIC, 3, offset)

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    step(0)
    step(1)
    checkpoint.aborted()  # done again in the next transaction, and counted there
    assert sample("splitbrain_dlq_messages_total", reason="invalid") == 0
    assert sample("splitbrain_transactions_total", outcome="aborted") == 1
    step(0)
    checkpoint.committed(0.01)
    assert sample("splitbrain_dlq_messages_total", reason="invalid") == 1
    assert sample("splitbrain_transaction_events_sum") == 1
