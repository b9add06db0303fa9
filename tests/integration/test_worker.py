"""`splitbrain worker` end to end: replay a history, tail the findings, compare with audit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from detector.testing.kafka import LocalKafka
from tests.integration.worker_harness import (
    PARTITIONS,
    Running,
    cli,
    metrics_or_empty,
    samples,
    wait_for,
)
from tests.paths import SEED_FIXTURE as FIXTURE
from tests.torture.poison import corpus


@pytest.fixture(params=["memory", "rocksdb"])
def worker(
    kafka_broker: LocalKafka, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Running]:
    running = Running(
        kafka_broker, tmp_path, "--store", request.param, "--state-dir", str(tmp_path / "state")
    )
    try:
        yield running
    finally:
        running.stop()


def test_replay_then_tail_gives_what_audit_gives(worker: Running) -> None:
    replayed = cli("replay", str(FIXTURE), "--topic", worker.input, bootstrap=worker.bootstrap)
    assert replayed.returncode == 0, replayed.stderr
    audit = subprocess.run(
        [sys.executable, "-m", "detector.cli", "audit", str(FIXTURE), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    expected = [json.loads(line) for line in audit.stdout.splitlines()]

    def tail() -> list[dict[str, object]]:
        out = cli(
            "tail",
            "--from-beginning",
            "--format",
            "json",
            "--idle-timeout",
            "2",
            "--topic",
            worker.findings,
            bootstrap=worker.bootstrap,
        )
        return [json.loads(line) for line in out.stdout.splitlines()]

    wait_for(lambda: tail() == expected, 90, "the worker's findings to equal audit's")
    # The fixture leaves one critical finding open; each partition reports every 5 s.
    wait_for(
        lambda: open_by_severity(worker) == {"critical": 1.0, "warning": 0.0, "info": 0.0},
        30,
        "the open critical finding on /metrics",
    )
    assert worker.stop() == 0  # SIGTERM: commit and leave the group cleanly
    log = worker.log.read_text()
    assert "finding sb-9132f5408be0d876ccd9 rev 4 critical open" in log
    assert "export-ledger" not in log  # logs carry ids and hashes, not workflow keys


def test_lag_and_last_poll_show_a_worker_that_keeps_up(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    w = Running(kafka_broker, tmp_path)
    try:
        replayed = cli("replay", str(FIXTURE), "--topic", w.input, bootstrap=w.bootstrap)
        assert replayed.returncode == 0, replayed.stderr
        caught_up = {str(p): 0.0 for p in range(PARTITIONS)}
        wait_for(
            lambda: samples(w, "splitbrain_consumer_lag_records") == caught_up,
            60,
            "every partition's lag to be reported at 0",
        )

        def last_poll() -> float:
            return samples(w, "splitbrain_worker_last_poll_timestamp_seconds")[""]

        first = last_poll()
        assert abs(time.time() - first) < 5
        wait_for(lambda: last_poll() > first, 10, "the last-poll time to advance")
    finally:
        w.stop()


def open_by_severity(w: Running) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_or_empty(w)):
        for sample in family.samples:
            if sample.name == "splitbrain_findings_open":
                severity = sample.labels["severity"]
                totals[severity] = totals.get(severity, 0.0) + sample.value
    return totals


def test_every_poison_record_lands_on_the_dlq_once(worker: Running) -> None:
    records = corpus(largest_value=1_000_000)
    producer = Producer(
        {
            "bootstrap.servers": worker.bootstrap,
            "message.max.bytes": 4 << 20,
            "partitioner": "murmur2_random",
        }
    )
    for _, key, value in records:
        producer.produce(worker.input, key=key, value=value)
    good = FIXTURE.read_bytes().splitlines()[0]
    producer.produce(worker.input, key=b"export-ledger", value=good)
    assert producer.flush(30) == 0

    wait_for(lambda: len(worker.read_all(worker.dlq)) >= len(records), 90, "all dead letters")
    dead = worker.read_all(worker.dlq)
    sources = [(h["source.partition"], h["source.offset"]) for _, _, h in dead]
    assert len(dead) == len(records) and len(set(sources)) == len(records)
    assert all(h["source.topic"] == worker.input.encode() for _, _, h in dead)
    assert all(h["error.reason"] for _, _, h in dead)
    by_record = {(k, v): h for k, v, h in dead}
    _, key, value = next(r for r in records if r[0] == "key_mismatch")
    mismatch = by_record[(key, value)]
    assert mismatch["error.reason"].startswith(b"key_mismatch")
    assert mismatch["error.field"] == b"workflow_key"
    wait_for(
        lambda: 'splitbrain_events_total{kind="lease_acquired"} 1.0' in worker.metrics(),
        30,
        "the valid event to be counted",
    )
    metrics = worker.metrics()
    dead_by_reason = {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "splitbrain_dlq_messages_total"
    }
    assert sum(dead_by_reason.values()) == len(records), dead_by_reason
    assert dead_by_reason["too_large"] >= 1 and dead_by_reason["key_mismatch"] >= 1
    assert "export-ledger" not in metrics


def test_a_finding_resolved_by_silence_is_not_republished_after_a_restart(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    w = Running(kafka_broker, tmp_path, "--quiet-period-s", "1")
    try:
        producer = Producer({"bootstrap.servers": w.bootstrap, "partitioner": "murmur2_random"})
        for seq, epoch, kind in [
            (1, 1, "lease_acquired"),
            (2, 2, "lease_acquired"),
            (3, 1, "progress"),
        ]:
            doc = {
                "event_id": f"q{seq}",
                "kind": kind,
                "workflow_key": "quiet-wf",
                "owner_epoch": epoch,
                "worker_id": f"w{epoch}",
                "seq": seq,
            }
            producer.produce(w.input, key=b"quiet-wf", value=json.dumps(doc).encode())
        assert producer.flush(30) == 0

        def revisions() -> list[tuple[int, str]]:
            docs = [json.loads(v) for _, v, _ in w.read_all(w.findings)]
            return sorted((d["revision"], d["status"]) for d in docs)

        # the worker lets time pass every few seconds: the silent zombie counts as fenced
        wait_for(lambda: revisions() == [(1, "open"), (2, "resolved")], 60, "quiet resolution")
        assert w.stop() == 0
        w.start()  # restores from the changelog, then lets time pass again
        # the state gauge is first set by the restarted worker's first pass of time
        wait_for(lambda: "splitbrain_state_workflows{" in metrics_or_empty(w), 60, "a tick")
        assert revisions() == [(1, "open"), (2, "resolved")]
    finally:
        w.stop()


def test_sigterm_stops_the_worker_even_with_the_broker_down(tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path / "kafka")  # its own: this test kills it
    broker.start()
    try:
        w = Running(broker, tmp_path)
        try:
            wait_for(lambda: "restored partitions" in w.log.read_text(), 60, "the worker to start")
            broker.kill()
            os.kill(w.proc.pid, signal.SIGTERM)
            # bounded by the transaction timeout and the group leave, not by the broker's return
            wait_for(lambda: w.proc.poll() is not None, 90, "the worker to exit on SIGTERM")
            assert w.proc.returncode in (0, 1), w.log.read_text()[-2000:]
        finally:
            w.stop()
    finally:
        broker.stop()
