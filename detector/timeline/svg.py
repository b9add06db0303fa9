"""One finding's workflow as an SVG timeline: a lane per epoch, events in the verdict's order.

Marks come from the finding itself (its transition and conditions), so a mark is drawn even when
its event fell outside the kept window; the window adds the context around them. Here the
events are placed; `templates/timeline.svg` draws them (escaped: see `markup`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from markupsafe import Markup

from detector.contracts.findings import ConditionKind, Finding
from detector.timeline.markup import TEMPLATES
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

    @property
    def kept(self) -> bool:
        """False for a mark drawn from the finding alone: its event is not in the window."""
        return self.arrival != math.inf


@dataclass(frozen=True, slots=True)
class Timeline:
    svg: Markup
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
    pairs = [
        (partner, dup)
        for dup in dups
        if dup.event_id in x_of and (partner := _partner(finding, drawn, dup)) is not None
    ]
    svg = TEMPLATES.get_template("timeline/timeline.svg").render(
        f=finding,
        lanes=lanes,
        lane_y=lane_y,
        x_of=x_of,
        pairs=pairs,
        drawn=drawn,
        width=width,
        height=height,
        displaced=displaced,
        left=LEFT,
        right=RIGHT,
        top=TOP,
        fences=FENCES,
        css=_css_class,
    )
    return Timeline(Markup(svg), drawn, len(points) - len(drawn))
