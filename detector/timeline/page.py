"""`audit --html`: one self-contained HTML file, readable offline in an incident room.

No script, font or style comes from anywhere else, and the Content-Security-Policy forbids every
script: a value that escaped its escaping still could not run (`markup`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from detector.contracts.findings import Finding
from detector.report import count
from detector.timeline.markup import TEMPLATES
from detector.timeline.seen import Seen, Windows
from detector.timeline.svg import Timeline, draw

# Findings drawn, worst first; the others are listed in the summary only. A figure with its events
# is tens of kB: this keeps a report of a history with thousands of findings to a few MB.
MAX_DRAWN: Final = 50


@dataclass(frozen=True, slots=True)
class _Drawn:
    """A finding as the report draws it: its timeline, the events drawn (each with whether it
    is marked) and what the figure leaves out."""

    finding: Finding
    timeline: Timeline
    events: list[tuple[Seen, bool]]
    notes: list[str]


def _drawn(f: Finding, windows: Windows) -> _Drawn:
    seen, not_kept = windows.events(f.workflow_key)
    timeline = draw(f, seen)
    drawn = {p.event_id for p in timeline.points}
    marked = {p.event_id for p in timeline.points if p.marks}
    notes = []
    if timeline.left_out or not_kept:
        notes.append(
            f"{count(timeline.left_out + not_kept, 'event')} of this workflow left out of the "
            "figure (the nearest to the episode are drawn)"
        )
    if f.evidence_truncated:
        notes.append("evidence truncated by a retention cap")
    events = [(s, s.event.event_id in marked) for s in seen if s.event.event_id in drawn]
    return _Drawn(f, timeline, events, notes)


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
    return TEMPLATES.get_template("timeline/audit.html").render(
        source=source,
        events=events,
        workflows=workflows,
        findings=ordered,
        drawn=[_drawn(f, windows) for f in ordered[:MAX_DRAWN]],
        max_drawn=MAX_DRAWN,
    )
