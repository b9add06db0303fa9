"""Event-to-visible-finding latency of `splitbrain worker`, through a real local broker.

For each sample a fresh workflow gets a takeover and then a stale checkpoint; the clock runs from
the stale event's delivery report to the moment a read_committed consumer sees the finding.
Prints percentiles; asserts nothing. Run: `python bench/bench_latency.py [--samples N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

from bench_worker import workflow_key
from confluent_kafka import Consumer, Producer, TopicPartition
from stack import broker_with_topics, start_worker

from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import WorkerTopics

WARMUP = 5  # the first samples include the worker's start and restore
WARMUP_TIMEOUT_S = 60.0  # the first also waits for the worker to join its group


class Prober:
    """Opens a finding on a fresh workflow and times it until a read_committed consumer sees it.

    A live tail, not a read to the end: it measures when each finding becomes visible. Findings
    of other workflows (a background load's) are read and skipped.
    """

    def __init__(self, bootstrap: str, topics: WorkerTopics, partitions: int = 1) -> None:
        self.topics = topics
        self.reader = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"r-{topics.group}",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        self.reader.assign([TopicPartition(topics.findings, p, 0) for p in range(partitions)])
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0}
        )

    def _send(self, doc: dict[str, object]) -> None:
        self.producer.produce(
            self.topics.input,
            key=str(doc["workflow_key"]).encode(),
            value=json.dumps(doc).encode(),
        )

    def sample(self, wf: str, timeout_s: float = 5.0) -> float:
        """Milliseconds from the stale event's delivery to its finding's visibility."""
        base = {"workflow_key": wf, "source": "coordinator", "kind": "lease_acquired"}
        self._send({**base, "event_id": f"{wf}-1", "owner_epoch": 1, "worker_id": "a", "seq": 1})
        self._send({**base, "event_id": f"{wf}-2", "owner_epoch": 2, "worker_id": "b", "seq": 2})
        self.producer.flush(10)
        self._send(
            {
                "event_id": f"{wf}-3",
                "kind": "progress",
                "workflow_key": wf,
                "owner_epoch": 1,
                "worker_id": "a",
                "seq": 3,
            }
        )
        self.producer.flush(10)
        sent = time.perf_counter()
        while (left := sent + timeout_s - time.perf_counter()) > 0:
            msg = self.reader.poll(left)
            if msg is not None and msg.error() is None and msg.key() == wf.encode():
                return (time.perf_counter() - sent) * 1000
        raise SystemExit(f"no finding for {wf} within {timeout_s:.0f}s: is the worker running?")

    def close(self) -> None:
        self.reader.close()


class PacedLoad(threading.Thread):
    """History lines produced at a steady rate, in the background, until they run out or
    `stop`: the load a worker is under while `Prober` measures it."""

    def __init__(self, bootstrap: str, topic: str, lines: list[bytes], rate: float) -> None:
        super().__init__(name="paced-load", daemon=True)
        self.topic = topic
        self.records = [(workflow_key(raw), raw) for raw in lines]
        self.rate = rate
        self.sent = 0
        self._halt = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def run(self) -> None:
        started = time.monotonic()
        records, produce = self.records, self._producer.produce
        while not self._halt.is_set() and self.sent < len(records):
            due = min(len(records), int((time.monotonic() - started) * self.rate))
            for key, value in records[self.sent : due]:
                produce(self.topic, key=key, value=value)
            self.sent = max(self.sent, due)
            self._producer.poll(0)
            time.sleep(0.005)
        self._producer.flush(30)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def latencies(prober: Prober, samples: int, load: PacedLoad | None = None) -> list[float]:
    """`samples` latencies after `WARMUP` discarded ones; under `load` (started after the
    warm-up, given two seconds to reach its rate), only those taken while it runs."""
    for i in range(WARMUP):
        prober.sample(f"warmup-{i}", WARMUP_TIMEOUT_S)
    if load is not None:
        load.start()
        time.sleep(2.0)
    taken: list[float] = []
    try:
        while len(taken) < samples and (load is None or load.is_alive()):
            taken.append(prober.sample(f"wf-{len(taken)}"))
    finally:
        if load is not None:
            load.stop()
    return taken


def percentiles(taken: list[float]) -> dict[str, float]:
    """p50, p95, p99 and max, in the unit of `taken` (inclusive: never beyond the max)."""
    q = statistics.quantiles(taken, n=100, method="inclusive")
    return {"p50": q[49], "p95": q[94], "p99": q[98], "max": max(taken)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--commit-interval-ms", type=int, default=100)
    args = ap.parse_args()
    with broker_with_topics("lat") as (broker, topics):
        run(args, broker, topics)


def run(args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics) -> None:
    worker = None
    try:
        worker = start_worker(broker, topics, "--commit-interval-ms", str(args.commit_interval_ms))
        prober = Prober(broker.bootstrap, topics)
        taken = latencies(prober, args.samples)
        prober.close()
        q = percentiles(taken)
        print(
            f"machine: {os.cpu_count()} cpus; commit interval {args.commit_interval_ms} ms; "
            f"{len(taken)} samples"
        )
        print(
            f"event -> visible finding: p50 {q['p50']:.0f} ms, p95 {q['p95']:.0f} ms, "
            f"p99 {q['p99']:.0f} ms, max {q['max']:.0f} ms"
        )
    finally:
        if worker is not None:
            worker.stop()


if __name__ == "__main__":
    main()
