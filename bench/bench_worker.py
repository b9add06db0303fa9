"""Sustained throughput of one `splitbrain worker` process, through a real local broker.

The engine bench's history is published first; then a worker consumes it. Throughput is read from
what the worker's consumer group has committed (input offsets commit in the same transaction as
the findings and the state), sampled every half second: the rate over the middle of the run,
without the start (restore) and the tail. Prints numbers; asserts nothing.
Run: `python bench/bench_worker.py [--events N] [--workflows N] [--store memory|rocksdb]`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

from bench_engine import history
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from stack import broker_with_topics, machine, start_worker

from detector.devstack.kafka import LocalKafka
from detector.devstack.kafka_cluster import AnyKafka
from detector.devstack.topics import WorkerTopics
from detector.devstack.worker import WorkerProcess


def workflow_key(raw: bytes) -> bytes:
    """A history line's record key: its workflow, as the worker's intake requires."""
    return str(json.loads(raw)["workflow_key"]).encode()


def produce(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    """One record, waiting for room when the producer's queue is full (a bench produces faster
    than the broker takes it)."""
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            producer.poll(0.05)


def publish(bootstrap: str, topic: str, lines: list[bytes]) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000}
    )
    for raw in lines:
        produce(producer, topic, workflow_key(raw), raw)
    if producer.flush(120) != 0:
        raise SystemExit("the history was not fully published")


def committed(reader: Consumer, topics: WorkerTopics, partitions: int) -> int | None:
    """Input records the group has committed, summed over the partitions (None: not known yet,
    while the group coordinator starts). A consumer of the group that never joins it (no
    subscribe): the admin client's group-offsets call crashed this process before the group
    existed."""
    try:
        parts = [TopicPartition(topics.input, p) for p in range(partitions)]
        tps = reader.committed(parts, 10)
    except KafkaException:
        return None
    return sum(max(tp.offset, 0) for tp in tps)


def follow(
    worker: WorkerProcess,
    reader: Consumer,
    topics: WorkerTopics,
    partitions: int,
    total: int,
    every_s: float = 0.5,
) -> list[tuple[float, int]]:
    """(monotonic time, records committed) every `every_s` until all `total` are."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + 1800
    while not samples or samples[-1][1] < total:
        if not worker.alive():
            raise SystemExit(f"the worker exited with {worker.exit_code()}:\n{worker.tail()}")
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not finish within 30 minutes")
        done = committed(reader, topics, partitions)
        if done is not None:
            samples.append((time.monotonic(), done))
        time.sleep(every_s)
    return samples


@dataclass(frozen=True, slots=True)
class Throughput:
    """A consumer group's progress through `total` records, sampled from its commits."""

    samples: list[tuple[float, int]]  # (monotonic time, records committed)
    total: int

    @property
    def rate(self) -> float:
        """Records/s over the middle of the run: from the first commit to the last sample
        before the end was reached, without the start (restore) and the tail (NaN when the
        run was too short to have a middle)."""
        samples = self.samples
        first = next(i for i, (_, n) in enumerate(samples) if n > 0)
        last = next(i for i, (_, n) in enumerate(samples) if n >= self.total)
        begin, mid = samples[first], samples[max(first, last - 1)]
        return (mid[1] - begin[1]) / (mid[0] - begin[0]) if mid[0] > begin[0] else math.nan

    @property
    def first_commit_s(self) -> float:
        """From the start of the sampling to the group's first commit."""
        t0 = self.samples[0][0]
        return next(t for t, n in self.samples if n > 0) - t0

    @property
    def finished_s(self) -> float:
        """From the start of the sampling to the sample that saw every record committed."""
        return self.samples[-1][0] - self.samples[0][0]


def throughput(
    broker: AnyKafka,
    worker: WorkerProcess,
    topics: WorkerTopics,
    partitions: int,
    total: int,
    every_s: float = 0.5,
) -> Throughput:
    """Follow `worker` (just started, in the group `topics.group`) until it committed `total`
    input records."""
    reader = Consumer({**broker.client_config(), "group.id": topics.group})
    try:
        return Throughput(follow(worker, reader, topics, partitions, total, every_s), total)
    finally:
        reader.close()


def topic_bytes(broker: LocalKafka, topic: str) -> int:
    """Bytes of a topic's segments in the broker's log directory."""
    return sum(
        f.stat().st_size for f in (broker.data_dir / "data").glob(f"{topic}-*/*.log") if f.is_file()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--workflows", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--store", choices=["memory", "rocksdb"], default="memory")
    args = ap.parse_args()
    with broker_with_topics("wb", args.partitions) as (broker, topics):
        run(args, broker, topics)


def run(args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics) -> None:
    worker = None
    try:
        bootstrap = broker.bootstrap
        lines = history(args.events, args.workflows)
        started = time.perf_counter()
        publish(bootstrap, topics.input, lines)
        print(machine())
        print(
            f"published {len(lines):,} events over {args.workflows:,} workflows to "
            f"{args.partitions} partition(s) in {time.perf_counter() - started:.1f} s"
        )
        worker = start_worker(broker, topics, "--store", args.store)
        done = throughput(broker, worker, topics, args.partitions, len(lines))
        print(f"store {args.store}; worker defaults (commit every 100 ms or 5000 records)")
        print(
            f"committed {done.samples[-1][1]:,} events {done.finished_s:.1f} s after the worker "
            f"started ({done.first_commit_s:.1f} s to its first commit)"
        )
        print(
            f"sustained: {done.rate:,.0f} events/s committed (between the first and last commits)"
        )
        print(
            f"on the broker's disk: input {topic_bytes(broker, topics.input) / 1e6:,.1f} MB, "
            f"state changelog {topic_bytes(broker, topics.changelog) / 1e6:,.1f} MB "
            "(before compaction)"
        )
    finally:
        if worker is not None:
            worker.stop()


if __name__ == "__main__":
    main()
