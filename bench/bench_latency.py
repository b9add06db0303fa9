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
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from stack import broker_with_topics, start_worker

from detector.testing.kafka import LocalKafka
from detector.testing.topics import WorkerTopics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--commit-interval-ms", type=int, default=100)
    args = ap.parse_args()
    with broker_with_topics("lat") as (broker, topics):
        run(args, broker, topics)


def run(args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics) -> None:
    bootstrap = broker.bootstrap
    worker = None
    try:
        worker = start_worker(broker, topics, "--commit-interval-ms", str(args.commit_interval_ms))
        # a live tail, not a read to the end: it measures when each finding becomes visible
        reader = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"r-{topics.group}",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        reader.assign([TopicPartition(topics.findings, 0, 0)])
        producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0}
        )

        def send(doc: dict[str, object]) -> None:
            producer.produce(
                topics.input, key=str(doc["workflow_key"]).encode(), value=json.dumps(doc).encode()
            )

        latencies = []
        for i in range(args.samples + 5):
            wf = f"wf-{i}"
            base = {"workflow_key": wf, "source": "coordinator", "kind": "lease_acquired"}
            send({**base, "event_id": f"{wf}-1", "owner_epoch": 1, "worker_id": "a", "seq": 1})
            send({**base, "event_id": f"{wf}-2", "owner_epoch": 2, "worker_id": "b", "seq": 2})
            producer.flush(10)
            send(
                {
                    "event_id": f"{wf}-3",
                    "kind": "progress",
                    "workflow_key": wf,
                    "owner_epoch": 1,
                    "worker_id": "a",
                    "seq": 3,
                }
            )
            producer.flush(10)
            sent = time.perf_counter()
            while True:
                msg = reader.poll(5.0)
                if msg is None:
                    raise SystemExit(f"no finding for {wf} within 5s: is the worker running?")
                if msg.error() is None and msg.key() == wf.encode():
                    break
            if i >= 5:  # the first samples include the worker's start and restore
                latencies.append((time.perf_counter() - sent) * 1000)
        reader.close()
        q = statistics.quantiles(latencies, n=100)
        print(
            f"machine: {os.cpu_count()} cpus; commit interval {args.commit_interval_ms} ms; "
            f"{len(latencies)} samples"
        )
        print(
            f"event -> visible finding: p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, "
            f"p99 {q[98]:.0f} ms, max {max(latencies):.0f} ms"
        )
    finally:
        if worker is not None:
            worker.stop()


if __name__ == "__main__":
    main()
