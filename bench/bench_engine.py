"""Engine benchmark: parse + detect throughput, parse-only throughput, memory per workflow.

Prints numbers; asserts nothing. Run: `make bench` or `python bench/bench_engine.py [--events N]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import time
import tracemalloc
from collections.abc import Iterator
from typing import Final

from detector import gc_tuning
from detector.contracts.events import OwnershipEvent, parse_event_json
from detector.core import Detector, decode_state, encode_state

TARGET_RATE: Final = 90_000  # parse + detect, events/s (docs/decisions/0002)
TARGET_BYTES: Final = 1024  # per tracked workflow


def _event(
    eid: int, kind: str, wf: str, epoch: int, worker: str, seq: int, **extra: object
) -> bytes:
    doc: dict[str, object] = {
        "event_id": f"ev-{eid:09d}",
        "kind": kind,
        "workflow_key": wf,
        "owner_epoch": epoch,
        "worker_id": worker,
        "seq": seq,
        "observed_at": f"2026-07-26T10:{(seq // 60) % 60:02d}:{seq % 60:02d}Z",
        **extra,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def history(n_events: int, n_workflows: int, seed: int = 7) -> list[bytes]:
    """A mixed history: mostly healthy owners, some clean handoffs, ~2% planted split-brains."""
    rng = random.Random(seed)
    out: list[bytes] = []
    seqs = [0] * n_workflows
    epochs = [0] * n_workflows
    zombie = [False] * n_workflows
    eid = 0
    while len(out) < n_events:
        w = rng.randrange(n_workflows)
        wf = f"tenant-{w % 97}/export/{w:07d}"
        seqs[w] += 1
        s = seqs[w]
        eid += 1
        r = rng.random()
        if epochs[w] == 0 or r < 0.03:
            epochs[w] += 1
            zombie[w] = epochs[w] > 1 and rng.random() < 0.2
            out.append(
                _event(
                    eid,
                    "lease_acquired",
                    wf,
                    epochs[w],
                    f"worker-{epochs[w] % 13}",
                    s,
                    source="coordinator",
                    lease_duration_s=90,
                    heartbeat_interval_s=30,
                    attrs={"tool_class": "export"},
                )
            )
        elif zombie[w] and r < 0.10:
            kind = rng.choice(["progress", "effect_attempted", "effect_committed"])
            extra = {"effect_key": f"out/{w}/{s % 3}"} if kind != "progress" else {}
            out.append(
                _event(eid, kind, wf, epochs[w] - 1, f"worker-{(epochs[w] - 1) % 13}", s, **extra)
            )
        elif r < 0.55:
            out.append(_event(eid, "heartbeat", wf, epochs[w], f"worker-{epochs[w] % 13}", s))
        elif r < 0.80:
            out.append(
                _event(
                    eid,
                    "progress",
                    wf,
                    epochs[w],
                    f"worker-{epochs[w] % 13}",
                    s,
                    detail={"rows_processed": s * 100},
                )
            )
        elif r < 0.90:
            out.append(
                _event(
                    eid,
                    "effect_attempted",
                    wf,
                    epochs[w],
                    f"worker-{epochs[w] % 13}",
                    s,
                    effect_key=f"out/{w}/{s}",
                    destination="index",
                )
            )
        else:
            out.append(
                _event(
                    eid,
                    "effect_committed",
                    wf,
                    epochs[w],
                    f"worker-{epochs[w] % 13}",
                    s,
                    effect_key=f"out/{w}/{s}",
                    destination="index",
                    source="destination",
                )
            )
    return out


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} events/s"


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_per_workflow(
    n_workflows: int, *, worker: bool = True, restored: bool = False
) -> tuple[float, int]:
    """Track n workflows, each acquired, heartbeating and checkpointing once: as a worker holds
    them (each event observed at its processing time), or, with `worker=False`, with no clock
    given, as `audit` observes, which also keeps each event's time to measure silence on. With
    `restored`, as a worker holds them after a restore: each state decoded from its changelog
    bytes (only the decoded states are counted)."""

    def events() -> Iterator[OwnershipEvent]:
        for w in range(n_workflows):
            wf = f"tenant-{w % 97}/export/{w:07d}"
            yield parse_event_json(
                _event(
                    3 * w,
                    "lease_acquired",
                    wf,
                    1,
                    "worker-1",
                    1,
                    source="coordinator",
                    lease_duration_s=90,
                    heartbeat_interval_s=30,
                    attrs={"tool_class": "export"},
                )
            )
            yield parse_event_json(_event(3 * w + 1, "heartbeat", wf, 1, "worker-1", 2))
            yield parse_event_json(_event(3 * w + 2, "progress", wf, 1, "worker-1", 3))

    if restored:
        return restored_per_workflow(list(events()))
    gc.collect()
    before = rss_bytes()
    detector = Detector()
    for i, ev in enumerate(events()):
        detector.observe(ev, at=float(i) if worker else None)
    gc.collect()
    return (rss_bytes() - before) / n_workflows, len(detector.states)


def restored_per_workflow(events: list[OwnershipEvent]) -> tuple[float, int]:
    """Bytes per workflow the decoded states hold, against those the engine built them with:
    both traced (`tracemalloc`), not RSS, which would reuse the memory freed between them."""
    tracemalloc.start()
    built = Detector()
    for i, ev in enumerate(events):
        built.observe(ev, at=float(i))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    raw = [(key, encode_state(st)) for key, st in built.states.items()]
    n = len(raw)
    del built
    gc.collect()
    tracemalloc.start()
    states = {key: decode_state(value) for key, value in raw}
    decoded = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"traced: {held / n:,.0f} bytes per workflow as built, {decoded / n:,.0f} as decoded")
    return decoded / n, len(states)


def parse_and_detect(lines: list[bytes]) -> tuple[float, Detector]:
    detector = Detector()
    observe = detector.observe
    gc.collect()
    t0 = time.perf_counter()
    for raw in lines:
        observe(OwnershipEvent.model_validate_json(raw))
    return time.perf_counter() - t0, detector


def detection_costs(lines: list[bytes]) -> tuple[float, float]:
    """Seconds per event for the engine alone, and for the cheapest engine CPython allows.

    The cheapest engine reads the fields the rules need and keeps the event per workflow, with
    the same cap; it runs no rule. Both run on the same events, parsed beforehand.
    """
    events = [OwnershipEvent.model_validate_json(raw) for raw in lines]
    cap = Detector().config.max_evidence
    kept: dict[str, list[tuple[object, ...]]] = {}
    gc.collect()
    t0 = time.perf_counter()
    for ev in events:
        records = kept.get(ev.workflow_key)
        if records is None:
            records = kept[ev.workflow_key] = []
        observed = ev.observed_at
        records.append(
            (
                ev.event_id,
                ev.kind,
                ev.owner_epoch,
                ev.seq,
                ev.source,
                ev.effect_key,
                ev.worker_id,
                None if observed is None else observed.timestamp(),
            )
        )
        if len(records) > cap:
            del records[: cap // 4]
    floor_s = time.perf_counter() - t0
    observe = Detector().observe
    gc.collect()
    t0 = time.perf_counter()
    for ev in events:
        observe(ev)
    detect_s = time.perf_counter() - t0
    return detect_s / len(events), floor_s / len(events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--workflows", type=int, default=20_000)
    ap.add_argument("--memory-workflows", type=int, default=1_000_000)
    ap.add_argument("--floor-events", type=int, default=300_000)
    ap.add_argument("--memory-only", action="store_true", help="measure memory, then stop")
    ap.add_argument(
        "--memory-as",
        choices=("worker", "restored", "audit"),
        default="worker",
        help="observe with a processing time, as a worker does (default), or without, as audit; "
        "or decode every state from its changelog bytes, as a worker holds them after a restore",
    )
    args = ap.parse_args()

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}"
    )
    # First, on a fresh heap: memory freed by later steps would be reused and hide growth.
    per_wf, tracked = memory_per_workflow(
        args.memory_workflows,
        worker=args.memory_as != "audit",
        restored=args.memory_as == "restored",
    )
    print(
        f"memory: {per_wf:,.0f} bytes per tracked workflow at {tracked:,} workflows "
        f"(RSS delta, held as {args.memory_as})"
    )
    if args.memory_only:
        return

    lines = history(args.events, args.workflows)
    print(f"history: {len(lines):,} events over {args.workflows:,} workflows")

    default_gc = gc.get_threshold()
    both_default_s, _ = parse_and_detect(lines)
    thresholds = gc_tuning.tune()  # what `splitbrain` itself runs with
    print(f"gc thresholds: {thresholds} (as the splitbrain CLI sets them)")

    gc.collect()
    t0 = time.perf_counter()
    for raw in lines:
        OwnershipEvent.model_validate_json(raw)
    parse_s = time.perf_counter() - t0
    both_s, detector = parse_and_detect(lines)

    print(f"parse only:     {rate(len(lines), parse_s)}")
    print(
        f"parse + detect: {rate(len(lines), both_s)}  ({detector.counters.revisions:,} finding "
        f"revisions, {detector.counters.findings_opened:,} findings)"
    )
    print(f"ratio (parse+detect / parse-only throughput): {parse_s / both_s:.2f}")
    print(f"parse + detect, CPython's default gc {default_gc}: {rate(len(lines), both_default_s)}")

    detect_s, floor_s = detection_costs(lines[: args.floor_events])
    print(
        f"detection alone: {detect_s * 1e6:.2f} us/event; the cheapest engine CPython allows "
        f"(read the fields, keep the event, no rule): {floor_s * 1e6:.2f} us/event"
    )
    both_rate = len(lines) / both_s
    print(
        "targets (docs/decisions/0002): parse + detect >= "
        f"{TARGET_RATE:,} events/s: {'met' if both_rate >= TARGET_RATE else 'NOT MET'}; "
        f"<= {TARGET_BYTES:,} bytes per tracked workflow: "
        f"{'met' if per_wf <= TARGET_BYTES else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
