"""How `splitbrain worker` throughput grows with input partitions and worker processes.

Why: the product scales by Kafka's means only — more partitions, more workers in one group — so
the sizing rule an operator needs (events/s per worker core, partitions per peak rate) is a
measurement of that, not of the engine in a loop.

For each partition count, one history (bench_engine's) is published once to an input of that many
partitions; then for each process count, that many workers (kafka runtime, exactly-once, memory
store, defaults otherwise) start together in a fresh group with fresh outputs. The rate is the
group's committed input offsets over the window from 20% to 90% of the records committed: after
every worker joined and restored (no rebalance inside it), before the tail. CPU seconds of the
workers and of the broker are read from /proc over the same window, so the table also gives
events per worker CPU-second, the figure that does not depend on how many cores the machine
has. Prints a table and JSON; asserts nothing.
Run: `python bench/bench_scale.py [--events N] [--workflows N] [--partitions 1,2,4]
[--processes 1,2]`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Final

from bench_engine import history
from bench_worker import committed, publish
from confluent_kafka import Consumer
from stack import broker_with_topics, machine, outputs_on, start_worker

from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import WorkerTopics
from detector.devstack.worker import WorkerProcess

WINDOW: Final = (0.2, 0.9)  # the share of the records committed between which the rate is taken
TICK: Final = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # monotonic seconds
    done: int  # input records the group has committed
    worker_cpu_s: float
    broker_cpu_s: float


@dataclass(frozen=True, slots=True)
class Run:
    partitions: int
    processes: int
    events_per_s: float
    per_worker_cpu_s: float  # events per CPU-second of the workers, in the window
    worker_cores: float  # CPU-seconds of the workers per second, in the window
    broker_cores: float
    finished_s: float  # from the start of the workers to every record committed


def measure(
    broker: LocalKafka, topics: WorkerTopics, partitions: int, processes: int, total: int
) -> Run:
    workers: list[WorkerProcess] = []
    reader = Consumer({**broker.client_config(), "group.id": topics.group})
    try:
        workers = [
            start_worker(broker, topics, instance=f"p{partitions}-w{i}") for i in range(processes)
        ]
        pids = [w.proc.pid for w in workers if w.proc is not None]
        started = time.monotonic()
        samples: list[Sample] = []
        while not samples or samples[-1].done < total:
            for w in workers:
                if not w.alive():
                    raise SystemExit(f"a worker exited with {w.exit_code()}:\n{w.tail()}")
            if time.monotonic() - started > 1800:
                raise SystemExit("the workers did not finish within 30 minutes")
            done = committed(reader, topics, partitions)
            if done is not None:
                samples.append(
                    Sample(
                        time.monotonic(),
                        done,
                        sum(cpu_seconds(pid) for pid in pids),
                        cpu_seconds(broker.pid()),
                    )
                )
            time.sleep(0.25)
    finally:
        for w in workers:
            w.stop()
        reader.close()
    low, high = (next(s for s in samples if s.done >= share * total) for share in WINDOW)
    span, events = high.at - low.at, high.done - low.done
    worker_cpu = high.worker_cpu_s - low.worker_cpu_s
    return Run(
        partitions,
        processes,
        events / span,
        events / worker_cpu if worker_cpu else float("nan"),
        worker_cpu / span,
        (high.broker_cpu_s - low.broker_cpu_s) / span,
        samples[-1].at - started,
    )


def table(runs: Sequence[Run]) -> str:
    base = runs[0].events_per_s
    lines = [
        "| partitions | processes | events/s | vs 1 partition, 1 process | events per worker "
        "CPU-second | worker cores busy | broker cores busy | all committed after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(
            f"| {r.partitions} | {r.processes} | {r.events_per_s:,.0f} | "
            f"{r.events_per_s / base:.2f} | {r.per_worker_cpu_s:,.0f} | {r.worker_cores:.2f} | "
            f"{r.broker_cores:.2f} | {r.finished_s:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=600_000)
    ap.add_argument("--workflows", type=int, default=40_000)
    ap.add_argument("--partitions", default="1,2,4", help="partition counts, comma-separated")
    ap.add_argument("--processes", default="1,2", help="worker process counts, comma-separated")
    ap.add_argument("--json", help="also write the runs as JSON here")
    args = ap.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    processes = [int(p) for p in args.processes.split(",")]
    lines = history(args.events, args.workflows)
    print(machine())
    print(f"history: {len(lines):,} events over {args.workflows:,} workflows")
    runs: list[Run] = []
    for partitions in counts:
        with broker_with_topics(f"scale{partitions}", partitions) as (broker, published):
            publish(broker.bootstrap, published.input, lines)
            for n in processes:
                topics = outputs_on(broker, published.input, f"scale{partitions}x{n}", partitions)
                run = measure(broker, topics, partitions, n, len(lines))
                print(
                    f"{partitions} partition(s), {n} process(es): {run.events_per_s:,.0f} "
                    f"events/s, {run.per_worker_cpu_s:,.0f} events per worker CPU-second",
                    flush=True,
                )
                runs.append(run)
    print(table(runs))
    doc = json.dumps({"machine": machine(), "runs": [asdict(r) for r in runs]}, indent=2)
    print(doc)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(doc + "\n")


if __name__ == "__main__":
    main()
