"""One finding's workflow as an SVG timeline: a lane per epoch, events in the verdict's order.

Marks come from the finding itself (its transition and conditions), so a mark is drawn even when
its event fell outside the kept window; the window adds the context around them. Every string
from the input goes through `text`: escaped for HTML and with control characters made visible.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from detector.contracts.findings import ConditionKind, Finding
from detector.report import printable
from detector.timeline.seen import Seen

MAX_POINTS: Final = 200
STEP: Final = 56  # px between two events
LANE: Final = 72  # px between two lanes
LEFT: Final = 300  # room for lane labels
TOP: Final = 170  # room for the rotated condition labels
RIGHT: Final = 230  # room for the last event's rotated label
BOTTOM: Final = 60  # room for the seq numbers and the takeover's label

# The event kind a condition's event has, for a mark whose event is not in the window.
_CONDITION_EVENT: Final = {
    ConditionKind.STALE_ACTIVITY: "progress",
    ConditionKind.STALE_EFFECT_REJECTED: "effect_rejected",
    ConditionKind.STALE_EFFECT_ATTEMPT: "effect_attempted",
    ConditionKind.STALE_EFFECT_COMMITTED: "effect_committed",
    ConditionKind.DUPLICATE_EFFECT: "effect_committed",
}
FENCES: Final = frozenset({"lease_lost", "lease_released", "effect_rejected"})


def text(value: object) -> str:
    """Any input value as HTML text: controls shown as escapes, markup as characters."""
    return html.escape(printable(str(value)), quote=True)


@dataclass(slots=True)
class Point:
    event_id: str
    kind: str
    epoch: int
    worker: str
    seq: int | None
    arrival: float  # math.inf for a mark whose event the window did not keep
    effect_key: str | None = None
    source: str = ""
    marks: list[str] = field(default_factory=list)  # condition kinds this event triggered
    order: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Timeline:
    svg: str
    points: list[Point]
    left_out: int  # events kept for the workflow but not drawn


def _points(finding: Finding, seen: Sequence[Seen]) -> list[Point]:
    by_id: dict[str, Point] = {}
    for s in seen:
        e = s.event
        by_id.setdefault(
            e.event_id,
            Point(
                e.event_id,
                e.kind.value,
                e.owner_epoch,
                e.worker_id,
                e.seq,
                float(s.arrival),
                e.effect_key,
                e.source.value,
            ),
        )
    displaced = finding.displaced.owner_epoch if finding.displaced else None
    current = finding.current.owner_epoch if finding.current else None
    if finding.transition is not None and finding.transition.event_id not in by_id:
        t = finding.transition
        worker = finding.current.worker_id if finding.current else "?"
        by_id[t.event_id] = Point(
            t.event_id, "lease_acquired", current or 0, worker, t.seq, math.inf
        )
    for c in finding.conditions:
        point = by_id.get(c.event_id)
        if point is None:
            epoch = max(c.epochs) if c.epochs else displaced if displaced is not None else current
            owner = finding.displaced if epoch == displaced else finding.current
            point = by_id[c.event_id] = Point(
                c.event_id,
                _CONDITION_EVENT[c.kind],
                epoch or 0,
                owner.worker_id if owner else "?",
                c.seq,
                math.inf,
                c.effect_key,
            )
        if c.kind.value not in point.marks:
            point.marks.append(c.kind.value)
    return list(by_id.values())


def _order(finding: Finding, points: list[Point]) -> None:
    """By seq where the verdict was (an event without one takes the seq of the event before it in
    arrival), by arrival otherwise; a mark outside the window goes by its seq, else last, in the
    finding's own order (the transition, then its conditions as detected)."""
    by_seq = finding.ordering == "authoritative_seq"
    carried = -1.0
    for p in sorted(points, key=lambda p: p.arrival):
        if p.seq is not None:
            carried = float(p.seq)
        if not by_seq:
            p.order = (p.arrival, 0.0)
        elif p.arrival == math.inf:
            p.order = (float(p.seq) if p.seq is not None else math.inf, p.arrival)
        else:
            acquisition_first = 0.0 if p.kind == "lease_acquired" else 0.5
            p.order = (float(p.seq) if p.seq is not None else carried, acquisition_first)
    points.sort(key=lambda p: (p.order, p.arrival))  # stable: ties keep the finding's order


def _partner(finding: Finding, points: list[Point], dup: Point) -> Point | None:
    """The other commit of a duplicate: the latest earlier commit of its key under its epochs."""
    epochs = next(
        (set(c.epochs or []) for c in finding.conditions if c.event_id == dup.event_id), set()
    )
    earlier = [
        p
        for p in points
        if p is not dup
        and p.kind == "effect_committed"
        and p.effect_key == dup.effect_key
        and (not epochs or p.epoch in epochs)
        and p.order <= dup.order
    ]
    return earlier[-1] if earlier else None


def _select(points: list[Point], keep: set[str]) -> list[Point]:
    """At most MAX_POINTS, nearest (in order) to the marked events first; order kept."""
    if len(points) <= MAX_POINTS:
        return points
    anchors = [i for i, p in enumerate(points) if p.event_id in keep]

    def distance(i: int) -> int:
        return min((abs(i - a) for a in anchors), default=i)

    chosen = sorted(range(len(points)), key=lambda i: (distance(i), i))[:MAX_POINTS]
    return [points[i] for i in sorted(chosen)]


def _lanes(finding: Finding, points: Iterable[Point]) -> list[tuple[int, str]]:
    workers: dict[int, str] = {}
    for owner in (finding.displaced, finding.current):
        if owner is not None:
            workers[owner.owner_epoch] = owner.worker_id
    # The acquisition names an epoch's worker; else its first event not from a verifier.
    for p in sorted(points, key=lambda p: (p.kind != "lease_acquired", p.source == "verifier")):
        workers.setdefault(p.epoch, p.worker)
    return sorted(workers.items())


def _shape(p: Point, x: float, y: float) -> str:
    if p.kind == "lease_acquired":
        return f'<path class="shape" d="M{x} {y - 8} L{x + 8} {y} L{x} {y + 8} L{x - 8} {y} Z"/>'
    if p.kind in FENCES:
        return f'<rect class="shape" x="{x - 3}" y="{y - 11}" width="6" height="22"/>'
    if p.kind == "outcome_verified":
        return f'<path class="shape" d="M{x - 7} {y} L{x - 2} {y + 6} L{x + 8} {y - 7}"/>'
    if p.kind.startswith("effect_"):
        return f'<rect class="shape" x="{x - 7}" y="{y - 7}" width="14" height="14"/>'
    return f'<circle class="shape" cx="{x}" cy="{y}" r="6"/>'


def _css_class(p: Point, displaced: int | None) -> str:
    names = ["event", p.kind.replace("_", "-")]
    if p.marks:
        names.append("mark")
    if any(m in ("stale_effect_attempt", "stale_effect_committed") for m in p.marks):
        names.append("stale")
    if "duplicate_effect" in p.marks:
        names.append("duplicate")
    if p.kind in FENCES and p.epoch == displaced:
        names.append("fence")
    return " ".join(names)


def draw(finding: Finding, seen: Sequence[Seen]) -> Timeline:
    """The timeline of `finding` over the kept events `seen` of its workflow."""
    points = _points(finding, seen)
    _order(finding, points)
    keep = {p.event_id for p in points if p.marks}
    if finding.transition is not None:
        keep.add(finding.transition.event_id)
    dups = [p for p in points if "duplicate_effect" in p.marks]
    for dup in dups:
        partner = _partner(finding, points, dup)
        if partner is not None:
            keep.add(partner.event_id)
    drawn = _select(points, keep)
    lanes = _lanes(finding, drawn)
    lane_y = {epoch: TOP + i * LANE for i, (epoch, _) in enumerate(lanes)}
    x_of = {p.event_id: LEFT + i * STEP for i, p in enumerate(drawn)}
    width = LEFT + max(len(drawn) - 1, 0) * STEP + RIGHT
    height = TOP + max(len(lanes) - 1, 0) * LANE + BOTTOM
    displaced = finding.displaced.owner_epoch if finding.displaced else None
    ordering = (
        "ordered by seq (the verdict's order: authoritative_seq)"
        if finding.ordering == "authoritative_seq"
        else "ordered by arrival in the partition (the verdict's order: arrival)"
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'data-ordering="{finding.ordering}">',
        f"<title>timeline of {text(finding.workflow_key)}</title>",
        f'<text class="ordering" x="8" y="18">{text(ordering)}</text>',
    ]
    for epoch, worker in lanes:
        y = lane_y[epoch]
        role = " (displaced)" if epoch == displaced else ""
        out.append(
            f'<g class="lane" data-epoch="{epoch}" data-worker="{text(worker)}">'
            f'<line x1="{LEFT - 24}" y1="{y}" x2="{width - RIGHT + 24}" y2="{y}"/>'
            f'<text class="lane-label" x="8" y="{y + 4}">epoch {epoch}{role} · '
            f"{text(worker)}</text></g>"
        )
    transition = finding.transition
    if transition is not None and transition.event_id in x_of:
        x = x_of[transition.event_id]
        where = f"seq {transition.seq}" if transition.seq is not None else "by arrival"
        out.append(
            f'<g class="transition" data-event-id="{text(transition.event_id)}" '
            f'data-seq="{"" if transition.seq is None else transition.seq}">'
            f'<line x1="{x}" y1="{TOP - 30}" x2="{x}" y2="{height - 22}"/>'
            f'<text x="{x + 4}" y="{height - 8}">takeover {where} '
            f"({text(transition.event_id)})</text></g>"
        )
    for dup in dups:
        partner = _partner(finding, drawn, dup)
        if partner is not None and dup.event_id in x_of:
            x1, y1 = x_of[partner.event_id], lane_y[partner.epoch]
            x2, y2 = x_of[dup.event_id], lane_y[dup.epoch]
            bend = min(y1, y2) - 30 if y1 == y2 else (y1 + y2) / 2
            out.append(
                f'<path class="duplicate-pair" data-effect-key="{text(dup.effect_key or "")}" '
                f'd="M{x1} {y1} Q{(x1 + x2) / 2} {bend} {x2} {y2}"/>'
            )
    for p in drawn:
        x, y = x_of[p.event_id], lane_y[p.epoch]
        seq = "" if p.seq is None else str(p.seq)
        where = f"seq {seq}" if seq else "no seq"
        absent = ", not in the kept window" if p.arrival == math.inf else ""
        css = _css_class(p, displaced)
        tip = f"{p.kind} {p.event_id} ({where}{absent}) epoch {p.epoch} {p.worker}"
        if p.effect_key:
            tip += f" {p.effect_key}"
        out.append(
            f'<g class="{css}" data-event-id="{text(p.event_id)}" '
            f'data-kind="{p.kind}" data-seq="{seq}" data-epoch="{p.epoch}">'
            f"<title>{text(tip)}</title>{_shape(p, x, y)}"
            f'<text class="seq" x="{x}" y="{y + 24}">{seq}</text>'
        )
        if not p.marks and (p.kind == "outcome_verified" or p.kind in FENCES):
            out.append(
                f'<text class="closing-label" x="{x}" y="{y - 16}" '
                f'transform="rotate(-35 {x} {y - 16})">{p.kind}</text>'
            )
        for i, kind in enumerate(p.marks):
            label = f"{kind} · {where}"
            ly = y - 16 - 16 * i
            out.append(
                f'<text class="mark-label" data-kind="{kind}" x="{x}" y="{ly}" '
                f'transform="rotate(-35 {x} {ly})">{text(label)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return Timeline("".join(out), drawn, len(points) - len(drawn))
