#!/usr/bin/env python3
"""Draw the main panels of dashboards/splitbrain.json from Prometheus query results, as a PNG.

Grafana is not needed: the results are what Prometheus answered to each panel's own queries
(`tests/integration/test_dashboards.py` runs a worker on real data, asks Prometheus every panel
query and writes them down). Timeseries panels come from `/api/v1/query_range`, stat and bar
gauge panels from `/api/v1/query` at the end of the run, as Grafana would ask.

python scripts/render_dashboard.py RESULTS.json --out docs/dashboard.png

RESULTS.json: {"title", "start", "end", "panels": [{"title", "type", "unit", "decimals",
"thresholds", "targets": [{"expr", "legend", "instant", "series": [{"metric": {...},
"values": [[t, "v"], ...]}]}]}]}, in the form of Prometheus' own answers (an instant answer's
one value as a one-point list).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

# What the picture shows, in this order: what on-call reads first.
MAIN_PANELS = (
    "Detector workers up",
    "Findings that reached critical (time range)",
    "Open critical findings (now)",
    "Dead letters (time range)",
    "Findings opened by severity",
    "Open findings by severity",
    "Oldest open finding by severity",
    "Finding time to resolution by severity",
    "Zombie activity after takeover (seconds, time range)",
    "Zombie activity after takeover (seq positions, time range)",
    "Zombie activity after takeover by severity",
    "Takeover delay after lease expiry by tool class",
    "Events by kind",
    "Commit latency",
    "Heartbeat age by tool class",
    "Pager deliveries by sink and outcome",
)
COLUMNS = 4
# Grafana's dark theme, roughly.
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
PALETTE = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a")
SEVERITY_COLORS = {"info": "#8ab8ff", "warning": "#ff9830", "critical": "#f2495c"}


def legend(template: str, metric: dict[str, str]) -> str:
    """Grafana's legend format: {{label}} replaced by the series' label value."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), template)
    return text.strip() or "value"


def number(value: float, unit: str, decimals: int | None = None) -> str:
    if math.isnan(value):
        return "NaN"
    if decimals is not None:
        return f"{value:.{decimals}f}"
    if unit == "s":
        if abs(value) >= 3600:
            return f"{value / 3600:.1f} h"
        if abs(value) >= 60:
            return f"{value / 60:.1f} min"
        if abs(value) >= 1 or value == 0:
            return f"{value:.3g} s"
        return f"{value * 1000:.3g} ms"
    if value == int(value) and abs(value) < 1e6:
        return f"{int(value)}"
    return f"{value:.3g}"


def values(series: dict[str, Any]) -> tuple[list[float], list[float]]:
    times = [float(t) for t, _ in series["values"]]
    return times, [float(v) for _, v in series["values"]]


def color_of(label: str, i: int) -> str:
    for severity, color in SEVERITY_COLORS.items():
        if label.startswith(severity):
            return color
    return PALETTE[i % len(PALETTE)]


def style(ax: Axes, title: str) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left", pad=6)
    ax.tick_params(colors=TEXT, labelsize=7)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.grid(color=GRID, linewidth=0.5)


def timeseries(ax: Axes, panel: dict[str, Any], start: float) -> None:
    unit = panel.get("unit", "short")
    i = 0
    for target in panel["targets"]:
        for series in target["series"]:
            times, ys = values(series)
            label = legend(target["legend"], series["metric"])
            dashed = label.endswith("p99")
            ax.plot(
                [t - start for t in times],
                ys,
                color=color_of(label, i),
                linewidth=1.2,
                linestyle="--" if dashed else "-",
                label=label,
            )
            i += 1
    if i == 0:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(
            fontsize=5.5 if i > 6 else 6,
            ncol=2 if i > 6 else 1,
            facecolor=PANEL,
            edgecolor=GRID,
            labelcolor=TEXT,
            loc="upper left",
            framealpha=0.7,
        )
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.0f}s"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: number(y, unit)))


def stat(ax: Axes, panel: dict[str, Any]) -> None:
    ax.grid(False)
    ax.set_xticks([])
    ax.set_yticks([])
    found = [
        float(series["values"][-1][1])
        for target in panel["targets"]
        for series in target["series"]
        if series["values"]
    ]
    value = sum(found) if found else math.nan
    color = TEXT
    steps = (panel.get("thresholds") or {}).get("steps", [])
    for step in steps:
        if step["value"] is None or (not math.isnan(value) and value >= step["value"]):
            color = {"green": "#73bf69", "red": "#f2495c"}.get(step["color"], step["color"])
    ax.set_facecolor(color if steps else PANEL)
    ax.text(
        0.5,
        0.45,
        number(value, panel.get("unit", "short"), panel.get("decimals")) if found else "No data",
        color="#ffffff" if steps else TEXT,
        fontsize=26,
        fontweight="bold",
        ha="center",
        va="center",
        transform=ax.transAxes,
    )


def distribution(ax: Axes, panel: dict[str, Any]) -> None:
    """A histogram's cumulative `le` series as per-bucket bars (Grafana's heatmap format)."""
    cumulative: dict[float, float] = {}
    for target in panel["targets"]:
        for series in target["series"]:
            le = float(series["metric"]["le"])  # "+Inf" reads as inf
            cumulative[le] = cumulative.get(le, 0.0) + float(series["values"][-1][1])
    bounds = sorted(cumulative)
    counts = [
        cumulative[b] - (cumulative[bounds[i - 1]] if i else 0.0) for i, b in enumerate(bounds)
    ]
    labels = ["+Inf" if math.isinf(b) else f"≤{b:g}" for b in bounds]
    ax.bar(range(len(bounds)), counts, color="#5794f2")
    ax.set_xticks(range(len(bounds)), labels, rotation=60)
    if not bounds:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)


def render(results: dict[str, Any], out: Path, titles: Sequence[str] = MAIN_PANELS) -> Path:
    panels = {p["title"]: p for p in results["panels"]}
    chosen = [panels[t] for t in titles if t in panels]
    rows = math.ceil(len(chosen) / COLUMNS)
    heights = [
        1.4 if all(p["type"] == "stat" for p in chosen[r * COLUMNS : (r + 1) * COLUMNS]) else 3.0
        for r in range(rows)
    ]
    fig, axes = plt.subplots(
        rows,
        COLUMNS,
        figsize=(COLUMNS * 5.0, sum(heights) + 1.0),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    fig.patch.set_facecolor(BACKGROUND)
    start = float(results["start"])
    for i, ax in enumerate(axes.flat):
        if i >= len(chosen):
            ax.set_visible(False)
            continue
        panel = chosen[i]
        style(ax, panel["title"])
        if panel["type"] == "stat":
            stat(ax, panel)
        elif panel["type"] == "bargauge":
            distribution(ax, panel)
        else:
            timeseries(ax, panel, start)
    began = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    fig.suptitle(
        f"{results.get('title', 'splitbrain detector')} — {len(chosen)} panels of "
        f"dashboards/splitbrain.json, drawn from Prometheus' answers to their queries "
        f"(run of {float(results['end']) - start:.0f} s from {began})",
        color=TEXT,
        fontsize=11,
        x=0.01,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=BACKGROUND)
    plt.close(fig)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("results", type=Path, help="query results (JSON) of a run")
    ap.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    args = ap.parse_args()
    render(json.loads(args.results.read_text()), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
