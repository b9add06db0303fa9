"""The engine on a fleet-shaped history: does the cost per event stay flat as the state grows?

The history has the shape of a real fleet (issue 22): N workflows of about eight events each, a
few thousand active at a time and interleaved, one in seven with a zombie (its displaced owner
heartbeats and attempts an effect after the takeover; half of those are then fenced and their
effect verified, so their findings resolve, the other half stay open).

The events are parsed first; the engine alone is timed, in each third of the history, and the
last third's rate is compared with the first's (the target: at least 0.8):
- as a worker runs it: each event at its processing time, and `advance` every 5 s of it (the
  worker's tick), the processing clock running at `--rate` events per second;
- as `audit` runs it: no clock; `finish`, once at the end, is timed apart.

Asserts nothing. Run:
`python bench/bench_fleet.py [--workflows N] [--only worker|audit] [--write-jsonl PATH]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Final

from detector import gc_tuning
from detector.contracts.events import OwnershipEvent, parse_event_json
from detector.core import Config, Detector

TICK_S: Final = 5.0  # `detector.runtime.processor.TICK_EVERY_S`
_T0: Final = datetime(2026, 7, 26, 10, 0, tzinfo=UTC).timestamp()

Step = tuple[str, int, dict[str, object]]  # kind, epoch, extra fields


def _script(w: int, zombie: bool, rng: random.Random) -> list[Step]:
    """One workflow's events in the order they happen."""
    key: dict[str, object] = {"effect_key": f"out/{w}/0", "destination": "index"}
    acquired = {
        "source": "coordinator",
        "lease_duration_s": 90,
        "heartbeat_interval_s": 30,
        "attrs": {"tool_class": "export"},
    }
    if not zombie:
        return [
            ("lease_acquired", 1, acquired),
            ("heartbeat", 1, {}),
            ("progress", 1, {"detail": {"rows": w}}),
            ("heartbeat", 1, {}),
            ("effect_attempted", 1, key),
            ("effect_committed", 1, {**key, "source": "destination"}),
            ("progress", 1, {}),
            ("lease_released", 1, {"source": "coordinator"}),
        ]
    steps: list[Step] = [
        ("lease_acquired", 1, acquired),
        ("heartbeat", 1, {}),
        ("lease_acquired", 2, acquired),
        ("heartbeat", 1, {}),  # the zombie: stale activity
        ("effect_attempted", 1, key),  # and a stale attempt
        ("progress", 2, {}),
        ("effect_committed", 2, {**key, "source": "destination"}),
    ]
    if rng.random() < 0.5:  # fenced and verified: the finding resolves
        steps += [
            ("lease_lost", 1, {}),
            ("outcome_verified", 2, {**key, "source": "verifier"}),
        ]
    steps.append(("lease_released", 2, {"source": "coordinator"}))
    return steps


def fleet(
    n_workflows: int, active: int = 2_000, zombie_every: int = 7, seed: int = 11
) -> list[bytes]:
    """The fleet's events as JSON lines, in arrival order, 100 per second of `observed_at`."""
    rng = random.Random(seed)
    pending: list[tuple[int, list[Step], int]] = []  # workflow, its steps, the next step
    started = 0
    out: list[bytes] = []
    while started < n_workflows or pending:
        while len(pending) < active and started < n_workflows:
            w = started
            started += 1
            pending.append((w, _script(w, rng.randrange(zombie_every) == 0, rng), 0))
        i = rng.randrange(len(pending))
        w, steps, at = pending[i]
        kind, epoch, extra = steps[at]
        doc = {
            "event_id": f"ev-{w:07d}-{at}",
            "kind": kind,
            "workflow_key": f"tenant-{w % 97}/export/{w:07d}",
            "owner_epoch": epoch,
            "worker_id": f"worker-{(w + epoch) % 13}",
            "seq": at + 1,
            "observed_at": datetime.fromtimestamp(_T0 + len(out) / 100, UTC).isoformat(),
            **extra,
        }
        out.append(json.dumps(doc, separators=(",", ":")).encode())
        if at + 1 == len(steps):
            pending[i] = pending[-1]
            pending.pop()
        else:
            pending[i] = (w, steps, at + 1)
    return out


def thirds(
    events: list[OwnershipEvent], feed: Callable[[Detector, Iterator[OwnershipEvent]], None]
) -> tuple[list[float], Detector]:
    """Events per second of `feed` in each third of the history, on one engine."""
    detector = Detector(Config())
    third = len(events) // 3
    rates: list[float] = []
    gc.collect()
    for n in range(3):
        part = events[n * third : len(events) if n == 2 else (n + 1) * third]
        started = time.perf_counter()
        feed(detector, iter(part))
        rates.append(len(part) / (time.perf_counter() - started))
    return rates, detector


def as_worker(rate: float) -> Callable[[Detector, Iterator[OwnershipEvent]], None]:
    """Each event at its processing time, `rate` events a second, and a tick every 5 s."""
    clock = {"n": 0, "tick": 0.0}

    def feed(detector: Detector, events: Iterator[OwnershipEvent]) -> None:
        n, last_tick = clock["n"], clock["tick"]
        observe, advance = detector.observe, detector.advance
        for event in events:
            n += 1
            now = n / rate
            observe(event, now)
            if now - last_tick >= TICK_S:
                advance(now)
                last_tick = now
        clock["n"], clock["tick"] = n, last_tick

    return feed


def as_audit(detector: Detector, events: Iterator[OwnershipEvent]) -> None:
    observe = detector.observe
    for event in events:
        observe(event)


def report(name: str, rates: list[float], detector: Detector) -> None:
    first, _, last = rates
    print(
        f"{name:<7} events/s by third: {', '.join(f'{r:,.0f}' for r in rates)}; "
        f"last / first {last / first:.2f} (target >= 0.8); {len(detector.states):,} states, "
        f"{detector.counters.findings_opened:,} findings, {detector.counters.revisions:,} "
        f"revisions"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=40_000)
    ap.add_argument("--rate", type=float, default=10_000.0, help="the worker's events per second")
    ap.add_argument("--write-jsonl", help="also write the history here, for `audit`")
    ap.add_argument("--only", choices=("worker", "audit"), help="run one of the two")
    args = ap.parse_args()
    gc_tuning.tune()
    lines = fleet(args.workflows)
    if args.write_jsonl:
        with open(args.write_jsonl, "wb") as fh:
            fh.writelines(line + b"\n" for line in lines)
    events = [parse_event_json(line) for line in lines]
    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; "
        f"fleet: {len(events):,} events over {args.workflows:,} workflows"
    )
    if args.only != "audit":
        report("worker", *thirds(events, as_worker(args.rate)))
    if args.only != "worker":
        rates, detector = thirds(events, as_audit)
        report("audit", rates, detector)
        started = time.perf_counter()
        detector.finish()
        print(f"audit's finish: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
