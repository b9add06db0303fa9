"""A worker on a fleet-shaped history: is its cost per event flat as its state grows?

Why: a detector runs for months beside its fleet, so a worker that slows as it tracks more
workflows falls behind for good. The history has the shape of a real fleet, published once on
six partitions: 40,000 workflows of about eight events each, interleaved (each workflow lives in
a window of a fifth of the history), one workflow in seven taken over and then written to by its
displaced owner (a zombie). On it, in one run: a plain consumer that validates every event, the
exactly-once worker, the at-least-once worker and the faust runtime's worker, each rated per third
of the history it committed (from its group's committed offsets, sampled every half second), and
the plain consumer again at the end (on a loaded machine the load drifts between the rows: each
ratio is against the mean of the two). The faust runtime commits a transaction per partition
where the kafka runtime commits one, and on this history it is some fifty times slower: it runs
on the first --faust-events events only, published on a topic of their own (all by default).
Targets: the last third >= 0.8 x the first (flat); the whole run >= 0.35 x consume + validate.
Also the exactly-once worker's changelog bytes per input byte (target <= 0.25). Prints numbers;
asserts nothing.
Run: `python bench/bench_fleet_worker.py [--workflows N] [--partitions N]`.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from dataclasses import dataclass
from typing import Final

from bench_engine import _event
from bench_side_by_side import consume_rate
from bench_worker import Throughput, publish, throughput, topic_bytes
from stack import broker_with_topics, machine, outputs_on, start_worker

from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import WorkerTopics

FLAT: Final = 0.8  # last third / first third
OF_CONSUME: Final = 0.35  # whole run / consume + validate
CHANGELOG: Final = 0.25  # changelog bytes per input byte
LIFE: Final = 0.2  # a workflow's window, as a share of the history


def fleet(workflows: int, per_workflow: int, zombie_every: int, seed: int = 11) -> list[bytes]:
    """Each workflow acquired, then heartbeats, progress and effects of its owner; one in
    `zombie_every` is taken over midway and its displaced owner commits once more."""
    rng = random.Random(seed)
    timed: list[tuple[float, bytes]] = []
    eid = 0
    for w in range(workflows):
        wf = f"tenant-{w % 97}/fleet/{w:07d}"
        n = max(3, per_workflow + rng.randint(-2, 2))
        start = rng.random() * (1 - LIFE)
        times = sorted(start + rng.random() * LIFE for _ in range(n))
        takeover = n // 2 if w % zombie_every == 0 else None
        epoch = 1
        for seq, at in enumerate(times, 1):
            eid += 1
            owner = f"worker-{(w + epoch) % 13}"
            if seq in (1, takeover):
                epoch = 1 if seq == 1 else 2
                owner = f"worker-{(w + epoch) % 13}"
                line = _event(
                    eid,
                    "lease_acquired",
                    wf,
                    epoch,
                    owner,
                    seq,
                    source="coordinator",
                    lease_duration_s=90,
                    heartbeat_interval_s=30,
                    attrs={"tool_class": "export"},
                )
            elif takeover is not None and seq == takeover + 1:  # the zombie's write
                zombie = f"worker-{(w + 1) % 13}"
                line = _event(eid, "effect_committed", wf, 1, zombie, seq, effect_key=f"{wf}/z")
            else:
                kind = rng.choice(["heartbeat", "heartbeat", "progress", "effect_committed"])
                extra = {"effect_key": f"{wf}/{seq}"} if kind == "effect_committed" else {}
                line = _event(eid, kind, wf, epoch, owner, seq, **extra)
            timed.append((at, line))
    timed.sort(key=lambda t: t[0])
    return [line for _, line in timed]


@dataclass(frozen=True, slots=True)
class Thirds:
    """A worker's committed rate over each third of the history, and over all of it."""

    rates: tuple[float, float, float]
    whole: float

    @classmethod
    def of(cls, done: Throughput) -> Thirds:
        """From the first commit (the start and restore left out) to the last sample before
        the end (the partial last batch left out), as `Throughput.rate`."""
        samples, total = done.samples, done.total
        first = next(i for i, (_, n) in enumerate(samples) if n > 0)
        last = next(i for i, (_, n) in enumerate(samples) if n >= total)
        span = samples[first : max(first + 1, last)]
        marks = [span[0]]
        for k in (1, 2):
            marks.append(next((s for s in span if s[1] >= total * k / 3), span[-1]))
        marks.append(span[-1])
        rates = [
            (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else float("nan")
            for a, b in itertools.pairwise(marks)
        ]
        return cls((rates[0], rates[1], rates[2]), done.rate)

    def line(self) -> str:
        a, b, c = self.rates
        return (
            f"{a:,.0f} | {b:,.0f} | {c:,.0f} events/s per third; whole run {self.whole:,.0f}; "
            f"last/first {c / a:.2f} [target >= {FLAT}]"
        )


def rate_worker(
    broker: LocalKafka,
    input_topic: str,
    name: str,
    partitions: int,
    total: int,
    *flags: str,
    runtime: str = "kafka",
) -> tuple[Thirds, WorkerTopics, float]:
    """A worker of a fresh group on the history: its thirds, topics and run time."""
    topics = outputs_on(broker, input_topic, f"fleet-{name}", partitions)
    worker = start_worker(broker, topics, *flags, instance=name, runtime=runtime)
    try:
        done = throughput(broker, worker, topics, partitions, total)
    finally:
        worker.stop()
    return Thirds.of(done), topics, done.finished_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workflows", type=int, default=40_000)
    ap.add_argument("--events-per-workflow", type=int, default=8)
    ap.add_argument("--zombie-every", type=int, default=7)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--faust-events", type=int, help="events the faust runtime runs on")
    args = ap.parse_args()
    lines = fleet(args.workflows, args.events_per_workflow, args.zombie_every)
    with broker_with_topics("fleet", args.partitions) as (broker, topics):
        started = time.perf_counter()
        publish(broker.bootstrap, topics.input, lines)
        input_bytes = topic_bytes(broker, topics.input)
        print(machine())
        print(
            f"fleet history: {len(lines):,} events over {args.workflows:,} workflows (1 in "
            f"{args.zombie_every} with a zombie), {args.partitions} partitions, "
            f"{input_bytes / 1e6:,.1f} MB, published once in {time.perf_counter() - started:.1f} s"
        )
        plain = consume_rate(broker, topics.input, args.partitions, validate=True)
        print(f"consume + validate (parse_event_json), read_committed: {plain:,.0f} events/s")
        eos, eos_topics, took = rate_worker(
            broker, topics.input, "eos", args.partitions, len(lines)
        )
        print(f"worker, exactly-once: {eos.line()}; all in {took:.1f} s")
        print(f"  whole run / consume + validate: {eos.whole / plain:.2f} [target >= {OF_CONSUME}]")
        written = topic_bytes(broker, eos_topics.changelog)
        print(
            f"  changelog {written / 1e6:,.1f} MB (before compaction) / input "
            f"{input_bytes / 1e6:,.1f} MB = {written / input_bytes:.3f} bytes per input byte "
            f"[target <= {CHANGELOG}]"
        )
        alo, _, took = rate_worker(
            broker,
            topics.input,
            "alo",
            args.partitions,
            len(lines),
            *("--processing-guarantee", "at-least-once"),
        )
        print(f"worker, at-least-once: {alo.line()}; all in {took:.1f} s")
        print(f"  whole run / consume + validate: {alo.whole / plain:.2f}")
        print(f"  exactly-once / at-least-once, whole run: {eos.whole / alo.whole:.2f}")
        prefix = lines[: args.faust_events]
        faust_input = topics.input
        if len(prefix) < len(lines):
            config = broker.client_config()
            faust_input = WorkerTopics.fresh("prefix").create(config, args.partitions).input
            publish(broker.bootstrap, faust_input, prefix)
        faust, _, took = rate_worker(
            broker, faust_input, "faust", args.partitions, len(prefix), runtime="faust"
        )
        print(
            f"worker, faust runtime (exactly-once), the first {len(prefix):,} events: "
            f"{faust.line()}; all in {took:.1f} s"
        )
        print(f"  whole run / consume + validate: {faust.whole / plain:.2f}")
        again = consume_rate(broker, topics.input, args.partitions, validate=True)
        mean = (plain + again) / 2
        print(
            f"consume + validate again at the end: {again:,.0f} events/s; against the mean of "
            f"the two ({mean:,.0f}), whole runs: exactly-once {eos.whole / mean:.2f} "
            f"[target >= {OF_CONSUME}], at-least-once {alo.whole / mean:.2f}, faust "
            f"{faust.whole / mean:.2f}"
        )


if __name__ == "__main__":
    main()
