"""What three brokers cost the worker: its sustained throughput on one broker against a
three-broker cluster (topics at replication 3 and `min.insync.replicas` 2, as topics/topics.yaml's
default profile; internal topics alike), and how long its commits stop when the broker that
coordinates its group is killed (SIGKILL) mid-run and stays down.

Each round runs one broker, then the cluster, on the same history (one cluster at a time: three
JVMs of 256 MB each, as `splitbrain dev kafka start --brokers 3`); with several rounds the ratio of
the two rates is taken within a round, so a loaded machine's drift cancels. Prints numbers;
asserts nothing.
Run: `python bench/bench_brokers.py [--events N] [--workflows N] [--partitions N] [--rounds N]
[--give-up-s S] [--recovery-only]`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench_engine import history
from bench_worker import committed, publish, throughput
from confluent_kafka import Consumer
from stack import machine, start_worker

from detector.devstack.kafka import LocalKafka
from detector.devstack.kafka_cluster import CLUSTER_HEAP_MB, AnyKafka, LocalKafkaCluster
from detector.devstack.topics import WorkerTopics

JIT = ("-XX:TieredStopAtLevel=4",)  # the full JIT, as bench/stack.py gives its broker


@contextlib.contextmanager
def kafka(brokers: int, partitions: int) -> Iterator[tuple[AnyKafka, WorkerTopics]]:
    """A fresh broker or cluster (stopped on exit), every JVM with the same heap, and a worker's
    topics on it at the replication a production cluster of that size would use."""
    workdir = Path(tempfile.mkdtemp(prefix=f"splitbrain-bb{brokers}-"))
    server: AnyKafka
    if brokers == 1:
        server = LocalKafka(workdir / "kafka", heap_mb=CLUSTER_HEAP_MB, extra_jvm_args=JIT)
    else:
        server = LocalKafkaCluster(workdir / "kafka", brokers=brokers, extra_jvm_args=JIT)
    server.start()
    try:
        topics = WorkerTopics.fresh(f"bb{brokers}").create(
            server.client_config(), partitions, replication=min(brokers, 3)
        )
        yield server, topics
    finally:
        server.stop()


def rate(brokers: int, lines: list[bytes], partitions: int) -> float:
    """The worker's sustained committed events/s on `brokers` broker(s)."""
    with kafka(brokers, partitions) as (server, topics):
        publish(server.bootstrap, topics.input, lines)
        worker = start_worker(server, topics)
        try:
            return throughput(server, worker, topics, partitions, len(lines), 0.25).rate
        finally:
            worker.stop()


def recovery(lines: list[bytes], partitions: int, give_up_s: float) -> tuple[float, float, str]:
    """On the cluster: SIGKILL the broker that coordinates the worker's group, for good, once a
    third of the input is committed; a worker that exits meanwhile (`--commit-give-up-s`) is
    started again, as its supervisor would. Returns the seconds from the kill to the group's
    next commit, the longest gap between commits before the kill (what a commit costs anyway),
    and what the worker did."""
    with kafka(3, partitions) as (server, topics):
        assert isinstance(server, LocalKafkaCluster)
        publish(server.bootstrap, topics.input, lines)
        give_up = ("--commit-give-up-s", f"{give_up_s:g}")
        worker = start_worker(server, topics, *give_up)
        did = "kept running"
        reader = Consumer({**server.client_config(), "group.id": topics.group})
        try:
            samples: list[tuple[float, int]] = []
            while not samples or samples[-1][1] < len(lines) // 3:
                done = committed(reader, topics, partitions)
                if done is not None:
                    samples.append((time.monotonic(), done))
                time.sleep(0.05)
            victim = server.group_coordinator(topics.group)
            led = server.leader(topics.input, 0) == victim
            server.node(victim).kill()
            killed, at_kill = time.monotonic(), samples[-1][1]
            while (done := committed(reader, topics, partitions)) is None or done <= at_kill:
                if time.monotonic() - killed > 300 + give_up_s:
                    raise SystemExit(f"no commit within {300 + give_up_s:g} s of the kill")
                if not worker.alive():
                    did = (
                        f"exited with status {worker.exit_code()} "
                        f"{time.monotonic() - killed:.1f} s after the kill and was started again"
                    )
                    worker = start_worker(server, topics, *give_up)
                time.sleep(0.05)
            recovered = time.monotonic() - killed
            advanced = [b[0] for a, b in itertools.pairwise(samples) if b[1] > a[1]]
            gaps = [b - a for a, b in itertools.pairwise(advanced)]
            did += f"; the broker killed, {victim}, led input partition 0: {led}"
            return recovered, max(gaps, default=float("nan")), did
        finally:
            reader.close()
            worker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--workflows", type=int, default=40_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--give-up-s", type=float, default=60.0, help="the worker's --commit-give-up-s")
    ap.add_argument("--recovery-only", action="store_true", help="skip the throughput rounds")
    args = ap.parse_args()
    lines = history(args.events, args.workflows)
    print(machine())
    print(
        f"{len(lines):,} events over {args.workflows:,} workflows, {args.partitions} partitions; "
        f"every broker JVM -Xmx{CLUSTER_HEAP_MB}m"
    )
    ratios = []
    for n in range(1, 0 if args.recovery_only else args.rounds + 1):
        one = rate(1, lines, args.partitions)
        three = rate(3, lines, args.partitions)
        ratios.append(three / one)
        print(
            f"round {n}: 1 broker {one:,.0f} events/s; 3 brokers {three:,.0f} events/s; "
            f"3/1 = {three / one:.2f}"
        )
    if ratios:
        print(f"throughput, 3 brokers / 1 broker: median {statistics.median(ratios):.2f}")
    recovered, gap, did = recovery(lines, args.partitions, args.give_up_s)
    print(
        f"group coordinator killed: next commit {recovered:.1f} s later "
        f"(longest gap between commits before it: {gap:.2f} s); the worker {did}"
    )


if __name__ == "__main__":
    main()
