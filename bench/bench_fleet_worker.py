"""A worker on a fleet-shaped history: is its cost per event flat as its state grows?

Why: a detector runs for months beside its fleet, so a worker that slows as it tracks more
workflows, or as its workflows grow old, falls behind for good. The history has the shape of a
real fleet, published once on six partitions; each workflow's events come at random times in a
window of the history, so that a bounded number are live at once (`--live N`: N in mid-history).
Two shapes (`--shape`):
- short (the default): 40,000 workflows of about eight events each, each in a fifth of the
  history (a quarter of them live at once), one in seven taken over and then written to once by
  its displaced owner (a zombie);
- long: workflows whose state grows with their life, up to the engine's caps: 4,000 of about
  1,200 events each, 400 live at once, over 2 to 4 owners in turn, each handing over cleanly
  (released, then acquired); in one in seven, one takeover comes without a release and the
  displaced owner keeps writing.
On it, in one run: a plain consumer that validates every event, the exactly-once worker, the
at-least-once worker and the faust runtime's worker, each rated per third of the history it
committed (from its group's committed offsets, sampled every half second), and the plain
consumer again at the end (on a loaded machine the load drifts between the rows: each ratio is
against the mean of the two). The faust runtime commits a transaction per partition where the
kafka runtime commits one, and on this history it is some fifty times slower: it runs on the
first --faust-events events only, published on a topic of their own (all by default).
Targets: the last third >= 0.8 x the first (flat); the whole run >= 0.35 x consume + validate.
Also the exactly-once worker's changelog bytes per input byte (target <= 0.25). Prints numbers;
asserts nothing.
Run: `python bench/bench_fleet_worker.py [--shape short|long] [--workflows N] [--live N]
[--events-per-workflow N] [--partitions N] [--faust-events N]`; a steady-state fleet of 120,000
workflows, 4,000 live at once: `--workflows 120000 --live 4000 --faust-events 10000`; the long
shape: `--shape long --faust-events 10000`.
"""

from __future__ import annotations

import argparse
import time
from typing import Final

from bench_side_by_side import consume_rate
from bench_worker import publish, throughput, topic_bytes
from fleet_history import LIFE, SHAPES, ZOMBIE_EVERY, Thirds, by_shape, fleet
from stack import broker_with_topics, machine, outputs_on, start_worker

from detector.cli.arguments import positive_int
from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import WorkerTopics

OF_CONSUME: Final = 0.35  # whole run / consume + validate
CHANGELOG: Final = 0.25  # changelog bytes per input byte


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
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", choices=SHAPES, default="short", help="a workflow's life")
    ap.add_argument("--workflows", type=positive_int, help=by_shape(lambda s: s.workflows))
    ap.add_argument(
        "--events-per-workflow", type=positive_int, help=by_shape(lambda s: s.per_workflow)
    )
    ap.add_argument("--zombie-every", type=positive_int, default=ZOMBIE_EVERY)
    ap.add_argument(
        "--live",
        type=positive_int,
        help="workflows live at once in mid-history, or a fifth of the history each; "
        + by_shape(lambda s: s.live),
    )
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--faust-events", type=int, help="events the faust runtime runs on")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    workflows = args.workflows or shape.workflows
    per_workflow = args.events_per_workflow or shape.per_workflow
    live = args.live or shape.live
    lines = fleet(workflows, per_workflow, args.zombie_every, live=live, life=shape.life)
    with broker_with_topics("fleet", args.partitions) as (broker, topics):
        started = time.perf_counter()
        publish(broker.bootstrap, topics.input, lines)
        input_bytes = topic_bytes(broker, topics.input)
        print(machine())
        at_once = live or round(workflows * LIFE / (1 - LIFE))
        print(
            f"fleet history ({args.shape}): {len(lines):,} events over {workflows:,} workflows ("
            f"{shape.name}, ~{per_workflow:,} events each; 1 in {args.zombie_every} with a "
            f"zombie; ~{at_once:,} live at once), {args.partitions} partitions, "
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
