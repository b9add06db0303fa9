"""The campaign's table and its JSON: per source, what was found, missed and raised for nothing,
and how long a stale effect took to reach its finding."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from detector.testing.campaign.checker import TARGET_S, Slow
from detector.testing.campaign.driver import SourceResult
from detector.testing.campaign.nemesis import Fault, Step

_QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "max": 1.0}
# A fault that ended this long before a slow write is still shown beside it: a restarted worker
# or coordinator takes seconds to be back at work.
NEAR_S: Final = 10.0
SLOW_SHOWN: Final = 5  # the slowest positives the printed table lists per source; the JSON has all


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    return {k: percentile(values, q) for k, q in _QUANTILES.items()}


def summary(result: SourceResult) -> dict[str, Any]:
    v = result.verdict
    found = v.true_positives + v.false_negatives
    return {
        "source": result.source,
        "seed": result.seed,
        "runs": result.runs,
        "effects": result.writes,
        "true_positives": v.true_positives,
        "false_positives": v.false_positives,
        "false_negatives": v.false_negatives,
        "misgraded": v.misgraded,
        "blind": v.blind,
        "info_only": v.info_only,
        "recall": None if not found else v.true_positives / found,
        "latency_s": _quantiles(v.latencies_s),
        "latency_without_broker_restart_s": _quantiles(v.quiet_runs_s),
        "runs_with_broker_restart": len(result.restarted_runs),
        # The writes made while Kafka was down, from the broker's return: the detector's recovery.
        "latency_after_outage_s": _quantiles(v.after_outage_s),
        "outage_writes": len(v.after_outage_s),
        "broker_outages_s": [round(up - down, 1) for down, up in result.outages],
        "faults": dict(sorted(result.faults.items())),
        "undrained_runs": result.undrained_runs,
        "detector_restarts": result.restarts["detector"],
        "watcher_restarts": result.restarts["watcher"],
        "seconds": round(result.seconds, 1),
        "notes": v.notes,
        "slow": [
            _slow(s, result.schedules)
            for s in sorted(v.slow, key=lambda s: s.latency_s, reverse=True)
        ],
    }


def _slow(slow: Slow, schedules: dict[int, tuple[float, tuple[Step, ...]]]) -> dict[str, Any]:
    """A positive found later than the target, with its run's faults near it: where to look."""
    w = slow.positive.write
    began, steps = schedules.get(w.run, (None, ()))
    at = None if began is None else w.at - began
    return {
        "run": w.run,
        "workflow_key": w.workflow_key,
        "effect_key": w.effect_key,
        "kind": slow.positive.kind,
        "executor": w.executor,
        "process": w.process,
        "epoch": w.epoch,
        # A blind spot's code: the adapter could not show it, and a later event found it (a
        # successor's redo of the key, a duplicate), so the latency is that event's.
        "blind": w.blind,
        "at_s": None if at is None else round(at, 2),  # from the start of the run's schedule
        "latency_s": round(slow.latency_s, 2),
        "faults": [] if at is None else [s.describe().strip() for s in steps if _near(s, at, slow)],
    }


def _near(step: Step, at: float, slow: Slow) -> bool:
    """Whether `step` was under way between `NEAR_S` before the write and its finding."""
    held = 0.0 if step.fault is Fault.CLOCK_STEP else step.hold_s  # a step's hold is its hours
    return step.at_s <= at + slow.latency_s and step.at_s + held >= at - NEAR_S


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'source':<18} {'runs':>4} {'effects':>7} {'TP':>4} {'FP':>3} {'FN':>3} {'misgr':>5} "
        f"{'blind':>5} {'recall':>6} {'p50 s':>6} {'p95 s':>6} {'max s':>6} {'p95 q':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lat = r["latency_s"]
        recall = "-" if r["recall"] is None else f"{100 * r['recall']:.0f}%"
        lines.append(
            f"{r['source']:<18} {r['runs']:>4} {r['effects']:>7} {r['true_positives']:>4} "
            f"{r['false_positives']:>3} {r['false_negatives']:>3} {r['misgraded']:>5} "
            f"{r['blind']:>5} {recall:>6} {_s(lat['p50'])} {_s(lat['p95'])} {_s(lat['max'])} "
            f"{_s(r['latency_without_broker_restart_s']['p95'])}"
        )
    lines.append("p95 q: in the runs without a broker restart")
    for r in rows:
        lines += [f"{r['source']}: {note}" for note in r["notes"]]
        if slow := r["slow"]:
            lines.append(f"{r['source']}: {len(slow)} found later than {TARGET_S:g} s; slowest:")
            lines += [f"  {_slow_line(x)}" for x in slow[:SLOW_SHOWN]]
        for role in ("detector", "watcher"):
            if restarts := r.get(f"{role}_restarts"):
                lines.append(f"{r['source']}: the {role} exited, started again {restarts} time(s)")
        if outages := r["broker_outages_s"]:
            after = r["latency_after_outage_s"]
            lines.append(
                f"{r['source']}: {len(outages)} broker restart(s), down {min(outages):g}-"
                f"{max(outages):g} s; {r['outage_writes']} found write(s) made while it was "
                f"down, found {_s(after['p50']).strip()} s (p50) and {_s(after['max']).strip()} s "
                "(max) after it served again"
            )
    return "\n".join(lines)


def _slow_line(x: dict[str, Any]) -> str:
    at = "?" if x["at_s"] is None else f"{x['at_s']:g}"
    blind = "" if x["blind"] is None else f" ({x['blind']})"
    faults = "; ".join(x["faults"]) or "none near"
    return (
        f"run {x['run']} {x['workflow_key']} {x['kind']} {x['effect_key']} epoch {x['epoch']}"
        f"{blind} at {at} s: {x['latency_s']:.2f} s; faults: {faults}"
    )


def _s(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value:6.2f}"


def write_json(path: Path, rows: Sequence[dict[str, Any]], commit: str | None) -> None:
    doc = {"commit": commit, "machine": machine(), "sources": {r["source"]: r for r in rows}}
    path.write_text(json.dumps(doc, indent=2) + "\n")
