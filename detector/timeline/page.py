"""`audit --html`: one self-contained HTML file, readable offline in an incident room.

No script, font or style comes from anywhere else, and the Content-Security-Policy forbids every
script: a value that escaped its escaping still could not run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from detector.contracts.findings import Finding
from detector.report import context_sides, count, witness
from detector.timeline.seen import Seen, Windows
from detector.timeline.svg import Timeline, draw, text
from detector.version import package_version

# Findings drawn, worst first; the others are listed in the summary only. A figure with its events
# is tens of kB: this keeps a report of a history with thousands of findings to a few MB.
MAX_DRAWN: Final = 50
CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE: Final = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#111827;max-width:1400px}
h1{font-size:22px}h2{font-size:17px;margin-top:36px;border-top:1px solid #d1d5db;padding-top:16px}
table{border-collapse:collapse}td,th{border:1px solid #d1d5db;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f3f4f6}
.sev-critical{color:#b91c1c;font-weight:600}.sev-warning{color:#b45309;font-weight:600}
.sev-info{color:#1d4ed8}
.figure{overflow-x:auto;border:1px solid #e5e7eb;background:#fff}
.note{color:#4b5563}
pre.raw{white-space:pre-wrap;word-break:break-all;font-size:12px;background:#f9fafb;padding:8px}
pre.raw .marked{background:#fee2e2}
svg.timeline text{font:12px system-ui,sans-serif;fill:#111827;paint-order:stroke;
stroke:#fff;stroke-width:3px}
svg.timeline .lane line{stroke:#9ca3af;stroke-width:1}
svg.timeline .lane-label{font-weight:600}
svg.timeline .ordering{fill:#4b5563}
svg.timeline .seq{fill:#6b7280;font-size:10px;text-anchor:middle}
svg.timeline .transition line{stroke:#111827;stroke-width:2;stroke-dasharray:6 4}
svg.timeline .transition text{font-weight:600}
svg.timeline .event .shape{fill:#9ca3af;stroke:#4b5563;stroke-width:1.5}
svg.timeline .lease-acquired .shape{fill:#111827}
svg.timeline .outcome-verified .shape{fill:none;stroke:#15803d;stroke-width:3}
svg.timeline .lease-lost .shape,svg.timeline .lease-released .shape,
svg.timeline .effect-rejected .shape{fill:#2563eb;stroke:#1e3a8a}
svg.timeline .mark .shape{fill:#f59e0b;stroke:#92400e;stroke-width:2}
svg.timeline .stale .shape{fill:#dc2626;stroke:#7f1d1d}
svg.timeline .duplicate .shape{fill:#a78bfa;stroke:#5b21b6}
svg.timeline .mark-label{font-weight:600}
svg.timeline .closing-label{fill:#1e3a8a;font-size:11px}
svg.timeline .duplicate-pair{fill:none;stroke:#7c3aed;stroke-width:2.5;stroke-dasharray:2 3}
"""

LEGEND: Final = (
    "◆ acquisition · ● activity · ■ effect · ▮ fence (lost, released, rejected) · ✓ "
    "verification · red: a stale attempt or commit · purple: a duplicate commit · amber: "
    "another condition · dashed vertical line: the takeover · dotted purple curve: a "
    "duplicate's two commits"
)


def _link(i: int, label: str) -> str:
    return f'<a href="#f{i}">{label}</a>' if i <= MAX_DRAWN else label


def _summary(findings: list[Finding]) -> str:
    rows = []
    for i, f in enumerate(findings, start=1):
        conditions = ", ".join(
            f"{c.kind.value}@{'-' if c.seq is None else c.seq}" for c in f.conditions
        )
        if f.conditions_omitted:
            conditions += f" (+{f.conditions_omitted})"
        rows.append(
            f'<tr class="finding-row" data-severity="{f.severity.value}" '
            f'data-status="{f.status.value}">'
            f'<td class="sev-{f.severity.value}">{f.severity.value}</td>'
            f"<td>{f.status.value}</td>"
            f"<td>{_link(i, text(f.workflow_key))}</td>"
            f"<td>{text(conditions)}</td><td>{f.confidence} ({f.ordering})</td></tr>"
        )
    head = "<tr><th>severity</th><th>status</th><th>workflow</th><th>conditions</th>"
    head += "<th>confidence</th></tr>"
    table = f'<table class="summary">{head}{"".join(rows)}</table>'
    if len(findings) > MAX_DRAWN:
        table += (
            f'<p class="note">The timelines of the {MAX_DRAWN} worst findings are drawn below; '
            f"the other {len(findings) - MAX_DRAWN} are listed here only (audit --format json "
            "prints all of them).</p>"
        )
    return table


def _raw(seen: Iterable[Seen], timeline: Timeline) -> str:
    drawn = {p.event_id for p in timeline.points}
    marked = {p.event_id for p in timeline.points if p.marks}
    lines = []
    for s in seen:
        if s.event.event_id not in drawn:
            continue
        body = s.event.model_dump_json(exclude_none=True)
        css = ' class="marked"' if s.event.event_id in marked else ""
        lines.append(f"<span{css}>#{s.arrival} {text(body)}</span>")
    return '<pre class="raw">' + "\n".join(lines) + "</pre>"


def context_html(f: Finding, heading: str) -> str:
    """The finding's `context` (DESIGN §5) under a heading of tag `heading`, escaped; "" when
    it has none."""
    sides = context_sides(f)
    if not sides:
        return ""
    items = "".join(f"<li><b>{text(label)}</b>: {text(words)}</li>" for label, words in sides)
    return f'<{heading}>Context</{heading}><ul class="context">{items}</ul>'


def _finding(i: int, f: Finding, windows: Windows) -> str:
    seen, not_kept = windows.events(f.workflow_key)
    timeline = draw(f, seen)
    displaced = (
        f"epoch {f.displaced.owner_epoch} ({text(f.displaced.worker_id)}) still acting"
        if f.displaced
        else "one owner committed twice"
    )
    notes = []
    if timeline.left_out or not_kept:
        notes.append(
            f"{count(timeline.left_out + not_kept, 'event')} of this workflow left out of the "
            "figure (the nearest to the episode are drawn)"
        )
    if f.evidence_truncated:
        notes.append("evidence truncated by a retention cap")
    note = "".join(f'<p class="note">{n}</p>' for n in notes)
    return (
        f'<section class="finding" id="f{i}" data-finding-id="{text(f.finding_id)}">'
        f'<h2><span class="sev-{f.severity.value}">{f.severity.value.upper()}</span> '
        f'<span class="workflow">{text(f.workflow_key)}</span>: {displaced}</h2>'
        f'<p class="note">{text(f.finding_id)} rev {f.revision}, {f.status.value}, confidence '
        f"{f.confidence}, ordering {f.ordering}, sink {f.sink_outcome}</p>"
        f'<div class="figure">{timeline.svg}</div>{note}'
        f'<p class="note">{LEGEND}</p>'
        f'<h3>Witness</h3><p class="witness">{text(witness(f))}</p>'
        f"{context_html(f, 'h3')}"
        f'<h3>Response</h3><p class="response">{text(f.response)}</p>'
        f"<h3>Events around the episode</h3>{_raw(seen, timeline)}</section>"
    )


def render(
    findings: Iterable[Finding],
    windows: Windows,
    *,
    source: str,
    events: int,
    workflows: int,
) -> str:
    """The report: a summary table, then each finding (worst first) with its timeline."""
    ordered = sorted(findings, key=lambda f: (-f.severity.rank, f.workflow_key))
    counts = f"{count(events, 'event')}, {count(workflows, 'workflow')}, "
    counts += count(len(ordered), "finding")
    body = "".join(_finding(i, f, windows) for i, f in enumerate(ordered[:MAX_DRAWN], start=1))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>splitbrain audit: {text(source)}</title><style>{STYLE}</style></head><body>"
        f"<h1>splitbrain audit: {text(source)}</h1>"
        f'<p class="note">{counts} · splitbrain {text(package_version())}</p>'
        f"{_summary(ordered) if ordered else '<p>No finding.</p>'}{body}</body></html>\n"
    )
