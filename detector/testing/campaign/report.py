"""The campaign's table and its JSON: per source, what was found, missed and raised for nothing,
and how long a stale effect took to reach its finding."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detector.testing.campaign.driver import SourceResult

_QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "max": 1.0}


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
    }


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


def _s(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value:6.2f}"


def write_json(path: Path, rows: Sequence[dict[str, Any]], commit: str | None) -> None:
    doc = {"commit": commit, "machine": machine(), "sources": {r["source"]: r for r in rows}}
    path.write_text(json.dumps(doc, indent=2) + "\n")
