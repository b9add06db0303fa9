"""Soak: one `splitbrain worker` at half its maximum rate for N minutes; memory and lag must stay
flat (target: within ±5% between the start, after a warm-up, and the end).

Why: a leak, or a backlog that grows a little per batch, shows only as drift over time, under a
steady load the worker can keep up with; a throughput run cannot show it.

The load is bench_engine's history mix, endlessly, in generations: each is a history over a
number of fresh workflows (renamed per generation), then every workflow's release by its owner.
A share of the workflows (--zombie-fraction, 2% by default) has a zombie: the stale events of the
history's other zombies are left out. After the releases, a verifier confirms every effect key a
finding names (`outcome_verified`), so that a finding resolves once its zombie has been quiet for
the quiet period, as in a fleet where the displaced owner dies or is fenced soon after the
takeover and someone checks what it did. Without the verifications a finding with an effect
condition stays open, rightly, and its whole state is kept: the soak then measures open
findings piling up (about 8 KB each), not a leak.
A released workflow is evicted after the quiet period; one with a finding is compacted then, and
forgotten after --idle-ttl-s down to what its later revisions need (42 B), a remnant removed
after --remnant-ttl-s. So the workflows tracked are bounded by those with an event within
idle_ttl_s + idle_sweep_s plus the remnants not yet expired: the bound is computed from what was
produced and printed beside the count. The worker's
periods are shortened so that workflows go through their whole life, from acquisition to
forgetting, many times within the run.

The maximum rate is measured first on the same stream (its own topics and worker, the group's
committed offsets over the middle of the run), unless --rate gives it. Every few seconds: the
worker's RSS (/proc/<pid>/status VmRSS), the lag (input end offsets minus the group's committed
offsets; the worker's own splitbrain_consumer_lag_records beside it), events/s committed, and the
workflows it tracks. Writes a PNG and the samples as CSV and JSON next to it. Prints numbers;
asserts nothing. Run: `python bench/bench_soak.py --minutes N [--rate R] [--out docs/soak.png]`;
`--replay CSV --minutes N --rate R` summarizes and plots the samples a run kept (the CSV is
rewritten as the run goes), with `--warmup` to move the start window past a disturbance.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final

from bench_engine import _event, history
from bench_recovery import tagged
from bench_worker import committed, produce, publish, throughput
from confluent_kafka import Consumer, IsolationLevel, Producer
from confluent_kafka.admin import AdminClient
from matplotlib.figure import Figure
from stack import broker_with_topics, machine, start_worker, vm_kb

from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from detector.devstack.topics import WorkerTopics, end_offsets
from detector.devstack.worker import Labels, WorkerProcess
from detector.histories.audit import audit_lines

TEMPLATES: Final = 4  # distinct histories the generations cycle through (renamed each time)
Event = tuple[bytes, bytes]  # record key, value


@dataclass(frozen=True, slots=True)
class Generation:
    events: list[Event]
    workflows: int
    zombies: int  # workflows with a finding, each kept as a remnant once forgotten


def generation(seed: int, workflows: int, per_workflow: int, zombies: int) -> Generation:
    """A history over `workflows` workflows, then each one's release by its current owner;
    only `zombies` of the workflows keep their stale events."""
    lines = history(workflows * per_workflow, workflows, seed)
    docs = [json.loads(raw) for raw in lines]
    stale: list[str] = []  # workflows with a stale event, in the order of their first one
    epochs: dict[str, int] = {}
    for doc in docs:
        wf, epoch = doc["workflow_key"], doc["owner_epoch"]
        if doc["kind"] == "lease_acquired":
            epochs[wf] = max(epochs.get(wf, 0), epoch)
        elif epoch < epochs.get(wf, 0) and wf not in stale:
            stale.append(wf)
    keep = set(random.Random(seed).sample(stale, min(len(stale), zombies)))
    owners: dict[str, tuple[int, str, int]] = {}  # workflow -> epoch, worker, last seq
    events: list[Event] = []
    for raw, doc in zip(lines, docs, strict=True):
        wf, seq = doc["workflow_key"], doc["seq"]
        epoch, worker, _ = owners.get(wf, (0, "", 0))
        if doc["kind"] == "lease_acquired" and doc["owner_epoch"] > epoch:
            epoch, worker = doc["owner_epoch"], doc["worker_id"]
        elif doc["owner_epoch"] < epoch and wf not in keep:
            continue  # a zombie left out
        owners[wf] = (epoch, worker, seq)
        events.append((wf.encode(), raw))
    eid = len(lines)  # the history's last event id
    for wf, (epoch, worker, seq) in owners.items():
        eid += 1
        events.append((wf.encode(), _event(eid, "lease_released", wf, epoch, worker, seq + 1)))
    for wf, key in flagged_keys(events):
        eid += 1
        epoch, _, seq = owners[wf]
        verified = _event(
            eid,
            "outcome_verified",
            wf,
            epoch,
            "verifier",
            seq + 2,
            source="verifier",
            effect_key=key,
        )
        events.append((wf.encode(), verified))
    return Generation(events, len(owners), len(keep))


def flagged_keys(events: list[Event]) -> list[tuple[str, str]]:
    """(workflow, effect key) of every effect key a finding of `events` names: what a verifier
    checks after an incident. Without it a finding with an effect condition stays open for ever
    (DESIGN §4), and its workflow is never forgotten."""
    findings = audit_lines(raw for _, raw in events).findings.values()
    return sorted(
        {
            (f.workflow_key, c.effect_key)
            for f in findings
            for c in f.conditions
            if c.effect_key is not None
        }
    )


class Load:
    """Generation after generation, each over fresh workflows and event ids, forever; it knows
    when each generation was produced, for the bound on the workflows tracked."""

    def __init__(self, workflows: int, per_workflow: int, zombie_fraction: float) -> None:
        zombies = round(workflows * zombie_fraction)
        self.templates = [
            generation(seed, workflows, per_workflow, zombies) for seed in range(TEMPLATES)
        ]
        self.done: list[tuple[float, Generation]] = []  # when each generation was produced

    def events(self, clock: Callable[[], float] = time.monotonic) -> Iterator[Event]:
        for g in itertools.count():
            template = self.templates[g % TEMPLATES]
            keys = tagged([key for key, _ in template.events], f"g{g}")
            raws = tagged([raw for _, raw in template.events], f"g{g}")
            yield from zip(keys, raws, strict=True)
            self.done.append((clock(), template))

    def bound(self, now: float, window_s: float, remnant_s: float) -> int:
        """Workflows the worker may track at `now`: every workflow of a generation produced
        within `window_s`, or still being produced, plus one remnant per zombie of those older
        by less than `window_s + remnant_s` (a remnant expires `remnant_s` after it is made)."""
        recent = [gen for at, gen in self.done if now - at < window_s]
        remnants = sum(
            gen.zombies for at, gen in self.done if window_s <= now - at < window_s + remnant_s
        )
        current = self.templates[len(self.done) % TEMPLATES]
        return sum(gen.workflows for gen in recent) + current.workflows + remnants


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the load started
    rss_mb: float | None
    lag: int | None  # input end offsets minus the group's committed offsets
    lag_metric: float | None  # the worker's splitbrain_consumer_lag_records
    committed: int | None
    committed_per_s: float | None
    produced: int
    workflows: float | None  # splitbrain_state_workflows
    bound: int  # what `workflows` may be: see Load.bound
    findings_opened: float | None  # splitbrain_findings_opened_total
    findings_open: float | None  # splitbrain_findings_open: a state kept whole, each


def total(metrics: Mapping[tuple[str, Labels], float], name: str) -> float | None:
    """A metric summed over its labels (None: the worker does not export it yet)."""
    values = [value for (sample, _), value in metrics.items() if sample == name]
    return sum(values) if values else None


class Sampler:
    def __init__(self, broker: LocalKafka, worker: WorkerProcess, topics: WorkerTopics) -> None:
        self.worker, self.topics = worker, topics
        self.admin = AdminClient(broker.client_config())
        self.reader = Consumer({**broker.client_config(), "group.id": topics.group})
        self.partitions = len(end_offsets(self.admin, topics.input))
        self.last: tuple[float, int] | None = None

    def sample(self, t: float, produced: int, bound: int) -> Sample:
        assert self.worker.proc is not None
        rss = vm_kb(self.worker.proc.pid)
        ends = end_offsets(self.admin, self.topics.input, IsolationLevel.READ_UNCOMMITTED)
        done = committed(self.reader, self.topics, self.partitions)
        rate = None
        if done is not None:
            if self.last is not None and t > self.last[0]:
                rate = (done - self.last[1]) / (t - self.last[0])
            self.last = (t, done)
        metrics = self.worker.metrics()
        return Sample(
            t=round(t, 2),
            rss_mb=None if rss is None else round(rss / 1024, 1),
            lag=None if done is None else sum(ends.values()) - done,
            lag_metric=total(metrics, "splitbrain_consumer_lag_records"),
            committed=done,
            committed_per_s=None if rate is None else round(rate, 1),
            produced=produced,
            workflows=total(metrics, "splitbrain_state_workflows"),
            bound=bound,
            findings_opened=total(metrics, "splitbrain_findings_opened_total"),
            findings_open=total(metrics, "splitbrain_findings_open"),
        )

    def close(self) -> None:
        self.reader.close()


def assigned(worker: WorkerProcess, timeout: float = 300.0) -> float:
    """Seconds until the worker exports its partitions' state sizes, which it does once it has
    its partitions and has restored them (its lag only once it has read a record, so not on the
    empty input): the load starts then, so that the start-up is no backlog in the samples."""
    started = time.monotonic()
    while total(worker.metrics(), "splitbrain_state_workflows") is None:
        if not worker.alive():
            raise SystemExit(f"the worker exited:\n{worker.tail()}")
        if time.monotonic() - started > timeout:
            raise SystemExit(f"the worker had no partition after {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - started


def show(s: Sample) -> None:
    """One sample, printed as it is taken, so that a long run can be followed."""
    rss = "n/a" if s.rss_mb is None else f"{s.rss_mb:,.1f}"
    lag = "n/a" if s.lag is None else f"{s.lag:,}"
    rate = "n/a" if s.committed_per_s is None else f"{s.committed_per_s:,.0f}"
    tracked = "n/a" if s.workflows is None else f"{s.workflows:,.0f}"
    still = "n/a" if s.findings_open is None else f"{s.findings_open:,.0f}"
    print(
        f"  {s.t / 60:6.1f} min  RSS {rss} MB  lag {lag}  committed {rate}/s  "
        f"tracked {tracked} (bound {s.bound:,})  open findings {still}",
        flush=True,
    )


def drive(
    producer: Producer,
    topic: str,
    load: Load,
    rate: float,
    seconds: float,
    sampler: Sampler,
    every_s: float,
    bound: Callable[[float], int],
    print_every_s: float,
    kept: Callable[[list[Sample]], None],
) -> list[Sample]:
    """Produce at `rate` events/s for `seconds`, sampling every `every_s`; the samples so far are
    `kept` at each printed one, so that a run cut short still leaves them."""
    samples: list[Sample] = []
    sent = 0
    started = time.monotonic()
    events = load.events()
    next_sample = next_print = started
    while (now := time.monotonic()) - started < seconds:
        due = int((now - started) * rate)
        while sent < due:
            produce(producer, topic, *next(events))
            sent += 1
        producer.poll(0)
        if now >= next_sample:
            if not sampler.worker.alive():
                raise SystemExit(f"the worker exited:\n{sampler.worker.tail()}")
            samples.append(sampler.sample(now - started, sent, bound(now)))
            next_sample += every_s
            if now >= next_print:
                show(samples[-1])
                kept(samples)
                next_print += print_every_s
        time.sleep(0.005)
    producer.flush(30)
    return samples


def calibrate(
    broker: LocalKafka, args: argparse.Namespace, flags: tuple[str, ...], partitions: int
) -> float:
    """The worker's maximum rate on this stream: its own topics and worker, from committed
    offsets."""
    topics = WorkerTopics.fresh("cal").create(broker.client_config(), partitions)
    load = Load(args.generation_workflows, args.events_per_workflow, args.zombie_fraction)
    lines = [raw for _, raw in itertools.islice(load.events(), args.calibrate_events)]
    publish(broker.bootstrap, topics.input, lines)
    worker = start_worker(broker, topics, *flags, instance="cal")
    try:
        return throughput(broker, worker, topics, partitions, len(lines)).rate
    finally:
        worker.stop()


def window(samples: list[Sample], start: float, end: float, field: str) -> float | None:
    values = [getattr(s, field) for s in samples if start <= s.t < end]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def drift(first: float | None, last: float | None) -> str:
    if first is None or last is None:
        return "n/a"
    if first == 0:
        return "n/a (0 at the start)"
    return f"{(last - first) / first * 100:+.1f}%"


def summarize(samples: list[Sample], args: argparse.Namespace, rate: float) -> dict[str, object]:
    seconds = args.minutes * 60
    warm = seconds * args.warmup
    tenth = seconds * 0.1
    out: dict[str, object] = {"warmup_s": warm}
    print(
        f"start = mean over {warm:.0f}-{warm + tenth:.0f} s (after the warm-up), end = mean over "
        f"the last {tenth:.0f} s; target: flat within ±5%"
    )
    names = {
        "rss_mb": "worker RSS (MB)",
        "lag": "lag (records, end offsets - committed)",
        "lag_metric": "lag (records, splitbrain_consumer_lag_records)",
        "committed_per_s": "events/s committed",
        "workflows": "workflows tracked",
        "findings_opened": "findings opened (cumulative)",
        "findings_open": "findings open",
    }
    for field, label in names.items():
        first = window(samples, warm, warm + tenth, field)
        last = window(samples, seconds - tenth, seconds + 1, field)
        out[field] = {"start": first, "end": last}
        shown = [f"{v:,.1f}" if v is not None else "n/a" for v in (first, last)]
        print(f"  {label}: start {shown[0]}, end {shown[1]}, drift {drift(first, last)}")
    after = [s for s in samples if s.t >= warm and s.rss_mb is not None]
    if len(after) >= 2:
        slope = statistics.linear_regression([s.t for s in after], [s.rss_mb or 0.0 for s in after])
        out["rss_slope_mb_per_hour"] = slope.slope * 3600
        print(f"  RSS trend after the warm-up: {slope.slope * 3600:+,.1f} MB/hour (least squares)")
    lags = [s.lag for s in samples if s.t >= warm and s.lag is not None]
    if lags:
        worst = out["lag_max"] = max(lags)
        print(f"  lag after the warm-up: max {worst:,} records ({worst / rate:.2f} s of load)")
    over = [s for s in samples if s.workflows is not None and s.workflows > s.bound]
    out["tracked_over_bound"] = len(over)
    print(
        f"  workflows tracked above the bound (active + within idle_ttl_s + remnants): "
        f"{len(over)} of {len(samples)} samples"
    )
    flat = {f: within(out[f], 0.05) for f in ("rss_mb", "lag")}
    out["flat"] = flat
    verdict = ", ".join(f"{f} {'flat' if ok else 'NOT flat'}" for f, ok in flat.items())
    print(f"verdict (±5% after the warm-up): {verdict}; tracked bounded: {not over}")
    return out


def within(start_end: object, tolerance: float) -> bool:
    """Whether the end of a window's mean is within `tolerance` of its start."""
    assert isinstance(start_end, dict)
    first, last = start_end["start"], start_end["end"]
    if first is None or last is None or first == 0:
        return False
    return bool(abs(last - first) / first <= tolerance)


def plot(samples: list[Sample], out: Path, rate: float, warm: float) -> None:
    t = [s.t / 60 for s in samples]
    fig = Figure(figsize=(10, 8))  # no pyplot: no display, no global state
    axes = fig.subplots(3, 1, sharex=True)
    rss, lag, done = axes
    rss.plot(t, [s.rss_mb for s in samples], color="tab:blue")
    rss.set_ylabel("worker RSS (MB)", color="tab:blue")
    tracked = rss.twinx()  # what the RSS should follow
    tracked.plot(t, [s.workflows for s in samples], color="tab:purple", alpha=0.5)
    tracked.plot(t, [s.bound for s in samples], color="tab:purple", linestyle=":", alpha=0.5)
    tracked.set_ylabel("workflows tracked", color="tab:purple")
    lag.plot(t, [s.lag for s in samples], color="tab:red", label="end offsets - committed")
    lag.plot(t, [s.lag_metric for s in samples], color="tab:orange", label="worker's metric")
    lag.set_ylabel("lag (records)")
    lag.legend(loc="upper right")
    done.plot(t, [s.committed_per_s for s in samples], color="tab:green", label="committed")
    done.axhline(rate, color="grey", linestyle="--", label="offered")
    done.set_ylabel("events/s")
    done.set_xlabel("minutes")
    done.legend(loc="lower right")
    for ax in axes:
        ax.axvspan(0, warm / 60, color="grey", alpha=0.15)
        ax.grid(alpha=0.3)
    fig.suptitle(f"splitbrain worker soak at {rate:,.0f} events/s (shaded: warm-up)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


def write_csv(samples: list[Sample], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".csv").open("w", newline="") as fh:
        rows = csv.writer(fh)
        rows.writerow([f.name for f in fields(Sample)])
        rows.writerows([getattr(s, f.name) for f in fields(Sample)] for s in samples)


_INTEGERS: Final = frozenset({"lag", "committed", "produced", "bound"})


def _cell(name: str, text: str) -> Any:
    """A CSV cell as `write_csv` wrote its field (an empty one is None)."""
    return None if text == "" else int(text) if name in _INTEGERS else float(text)


def read_csv(path: Path) -> list[Sample]:
    """The samples a run kept (`write_csv`)."""
    with path.open(newline="") as fh:
        return [
            Sample(**{name: _cell(name, text) for name, text in row.items()})
            for row in csv.DictReader(fh)
        ]


def write(samples: list[Sample], out: Path, meta: dict[str, object]) -> None:
    write_csv(samples, out)
    doc = {**meta, "samples": [asdict(s) for s in samples]}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--rate", type=float, help="the worker's maximum rate; measured if absent")
    ap.add_argument("--load", type=float, default=0.5, help="fraction of the maximum to offer")
    ap.add_argument("--out", type=Path, default=Path("docs/soak.png"))
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of the run left out")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--store", choices=["memory", "rocksdb"], default="memory")
    ap.add_argument("--quiet-period-s", type=float, default=60.0)
    ap.add_argument("--idle-ttl-s", type=float, default=120.0)
    ap.add_argument("--idle-sweep-s", type=float, default=30.0)
    ap.add_argument("--remnant-ttl-s", type=float, default=600.0)
    ap.add_argument("--zombie-fraction", type=float, default=0.02)
    ap.add_argument(
        "--print-every", type=float, default=60.0, help="seconds between printed samples"
    )
    ap.add_argument("--generation-workflows", type=int, default=5_000)
    ap.add_argument("--events-per-workflow", type=int, default=20)
    ap.add_argument("--calibrate-events", type=int, default=300_000)
    ap.add_argument(
        "--replay",
        type=Path,
        metavar="CSV",
        help="summarize and plot the samples a run kept instead of running one: give its "
        "--minutes and its maximum as --rate; --warmup moves the start window",
    )
    args = ap.parse_args()
    if args.replay is not None:
        if args.rate is None:
            ap.error("--replay needs --rate: the run's maximum rate")
        replay(args)
        return
    with broker_with_topics("soak", args.partitions) as (broker, topics):
        run(args, broker, topics)


def replay(args: argparse.Namespace) -> None:
    samples = read_csv(args.replay)
    rate = args.rate * args.load
    print(f"{len(samples)} samples from {args.replay}; offered {rate:,.0f} events/s")
    summarize(samples, args, rate)
    plot(samples, args.out, rate, args.minutes * 60 * args.warmup)
    print(f"wrote {args.out}")


def run(args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics) -> None:
    print(machine())
    flags = (
        *("--store", args.store, "--quiet-period-s", str(args.quiet_period_s)),
        *("--idle-ttl-s", str(args.idle_ttl_s), "--idle-sweep-s", str(args.idle_sweep_s)),
        *("--remnant-ttl-s", str(args.remnant_ttl_s)),
    )
    print(
        f"worker: store {args.store}, {args.partitions} partition(s), --quiet-period-s "
        f"{args.quiet_period_s:g} (released workflows evicted after it), --idle-ttl-s "
        f"{args.idle_ttl_s:g} --idle-sweep-s {args.idle_sweep_s:g} (resolved findings' "
        f"workflows forgotten after them), --remnant-ttl-s {args.remnant_ttl_s:g} (their "
        f"remnants removed after it), defaults otherwise; {args.zombie_fraction:.0%} of "
        f"the workflows with a zombie"
    )
    if args.rate is None:
        maximum = calibrate(broker, args, flags, args.partitions)
        print(f"maximum rate: {maximum:,.0f} events/s ({args.calibrate_events:,} events, measured)")
    else:
        maximum = args.rate
        print(f"maximum rate: {maximum:,.0f} events/s (given)")
    rate = maximum * args.load
    per_generation = args.generation_workflows * (args.events_per_workflow + 1)  # about
    steady = per_generation / rate + args.quiet_period_s
    print(
        f"load: {rate:,.0f} events/s ({args.load:.0%} of the maximum) for {args.minutes:g} min; "
        f"generations of {args.generation_workflows:,} workflows x ~{args.events_per_workflow} "
        f"events + a release each ({per_generation / rate:.0f} s per generation)"
    )
    if args.minutes * 60 * args.warmup < steady:
        print(
            f"note: the warm-up ({args.minutes * 60 * args.warmup:.0f} s) is shorter than a "
            f"generation plus the quiet period ({steady:.0f} s): the state is still filling"
        )
    worker = sampler = None
    producer = Producer({**broker.client_config(), "linger.ms": 5, "enable.idempotence": True})
    try:
        worker = start_worker(broker, topics, *flags, metrics_port=free_port(), instance="soak")
        print(f"worker processing {assigned(worker):.1f} s after its start; the load starts")
        sampler = Sampler(broker, worker, topics)
        load = Load(args.generation_workflows, args.events_per_workflow, args.zombie_fraction)
        remembered_s = max(args.quiet_period_s, args.idle_ttl_s + args.idle_sweep_s) + args.every
        remnant_s = args.remnant_ttl_s + args.idle_sweep_s  # the sweep that removes it
        samples = drive(
            producer,
            topics.input,
            load,
            rate,
            args.minutes * 60,
            sampler,
            args.every,
            lambda now: load.bound(now, remembered_s, remnant_s),
            args.print_every,
            lambda samples: write_csv(samples, args.out),
        )
    finally:
        if sampler is not None:
            sampler.close()
        if worker is not None:
            worker.stop()
    produced = samples[-1].produced if samples else 0
    print(f"produced {produced:,} events; {len(samples)} samples every {args.every:g} s")
    summary = summarize(samples, args, rate)
    meta: dict[str, object] = {
        "machine": machine(),
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "maximum_rate": maximum,
        "offered_rate": rate,
        "summary": summary,
    }
    plot(samples, args.out, rate, args.minutes * 60 * args.warmup)
    write(samples, args.out, meta)
    print(f"wrote {args.out}, {args.out.with_suffix('.csv')}, {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
