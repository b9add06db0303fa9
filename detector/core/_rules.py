"""The detection rules of DESIGN §4 as pure questions about one workflow's state.

Each answers in time independent of how many conditions or keys a finding holds: staleness by a
binary search over the acquisitions' suffix minima, verifications by `Marks`, fences by a few
points tested against the extremes of the episode's stale events (`Latest`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Final

from detector.contracts.events import Kind
from detector.contracts.findings import ConditionKind

from ._records import AcquisitionRecord, EventRecord, Latest, before, earliest
from ._state import FencePoint, WorkflowState

STALE_CONDITION: Final[dict[str, ConditionKind]] = {
    Kind.PROGRESS.value: ConditionKind.STALE_ACTIVITY,
    Kind.HEARTBEAT.value: ConditionKind.STALE_ACTIVITY,
    Kind.EFFECT_ATTEMPTED.value: ConditionKind.STALE_EFFECT_ATTEMPT,
    Kind.EFFECT_COMMITTED.value: ConditionKind.STALE_EFFECT_COMMITTED,
    Kind.EFFECT_REJECTED.value: ConditionKind.STALE_EFFECT_REJECTED,
}
# Effect kinds whose latest occurrence per (key, epoch) outlives the raw events.
EFFECT_OCCURRENCES: Final = frozenset(
    {Kind.EFFECT_ATTEMPTED.value, Kind.EFFECT_COMMITTED.value, Kind.EFFECT_REJECTED.value}
)
_NEVER: Final = 2**64  # above every seq and pos


def _index(state: WorkflowState) -> tuple[list[int], list[int], list[int], list[int]]:
    """Epochs ascending, and from each index on: the lowest seq, the lowest arrival of an
    acquisition without seq, and the lowest arrival."""
    if state.index is None:
        acqs = state.acqs
        n = len(acqs)
        min_seq, min_unseq, min_pos = [_NEVER] * (n + 1), [_NEVER] * (n + 1), [_NEVER] * (n + 1)
        for i in range(n - 1, -1, -1):
            a = acqs[i]
            min_seq[i] = min_seq[i + 1] if a.seq is None else min(min_seq[i + 1], a.seq)
            min_unseq[i] = min_unseq[i + 1] if a.seq is not None else min(min_unseq[i + 1], a.pos)
            min_pos[i] = min(min_pos[i + 1], a.pos)
        state.index = ([a.epoch for a in acqs], min_seq, min_unseq, min_pos)
    return state.index


def displaced(state: WorkflowState, epoch: int, seq: int | None, pos: int) -> bool:
    """Is some acquisition of a higher epoch before the event at (seq, pos)? (At one seq an
    acquisition comes first.)"""
    epochs, min_seq, min_unseq, min_pos = _index(state)
    i = bisect_right(epochs, epoch)
    if seq is not None:
        return min_seq[i] <= seq or min_unseq[i] < pos
    return min_pos[i] < pos


def placed_by_seq(state: WorkflowState, epoch: int, seq: int | None) -> bool:
    """Is an event of `epoch` at `seq` after a higher epoch's acquisition by `seq` (not only by
    arrival)?"""
    if seq is None:
        return False
    epochs, min_seq, _, _ = _index(state)
    return min_seq[bisect_right(epochs, epoch)] <= seq


def displacing(state: WorkflowState, ev: EventRecord) -> AcquisitionRecord | None:
    """The stale event's transition: the earliest acquisition of a higher epoch before it."""
    return earliest(a for a in state.acqs if a.epoch > ev.epoch and before(a, ev))


def first_higher(state: WorkflowState, epoch: int) -> AcquisitionRecord | None:
    """The earliest acquisition of a higher epoch: the handoff of an owner that never acted
    after it."""
    return earliest(a for a in state.acqs if a.epoch > epoch)


# Fence points kept per epoch: those with seq that no other is at or after in both seq and
# arrival, and one for the latest without seq. More than this only in a flood of fences that
# arrive against their seq order: the middle ones are dropped, and the finding says so.
FENCE_POINTS: Final = 8


def add_fence(points: list[FencePoint], seq: int | None, eid: str, pos: int) -> int:
    """Add a fence: 0 when it changes nothing, 1 when it does, 2 when points were dropped."""
    if seq is None:
        for i, (s, _, p) in enumerate(points):
            if s is None:
                if p >= pos:
                    return 0
                points[i] = (None, eid, pos)
                return 1
        points.append((None, eid, pos))
        return 1
    key = (seq, eid)
    if any(s is not None and (s, e) >= key and p >= pos for s, e, p in points):
        return 0
    points[:] = [q for q in points if q[0] is None or (q[0], q[1]) > key or q[2] > pos]
    points.append((seq, eid, pos))
    if len(points) <= FENCE_POINTS:
        return 1
    seqd = [q for q in points if q[0] is not None]
    keep = {max(seqd, key=lambda q: (q[0], q[1])), max(seqd, key=lambda q: q[2])}
    points[:] = [q for q in points if q[0] is None or q in keep]
    return 2


def fenced(state: WorkflowState, epoch: int, stale: Latest) -> bool:
    """Did `epoch` show it knew it lost, or hit a fence, not before any of its stale events?"""
    fences = state.fences
    points = None if fences is None else fences.get(epoch)
    if not points:
        return False
    top = stale.top
    for seq, eid, pos in points:
        if seq is None:
            if stale.last.pos <= pos:
                return True
        elif stale.unseq <= pos and (top is None or (top.seq, top.event_id) <= (seq, eid)):
            return True
    return False


def acquisition(state: WorkflowState, epoch: int) -> AcquisitionRecord | None:
    for a in state.acqs:
        if a.epoch == epoch:
            return a
    return None


def current_owner_before(state: WorkflowState, last: EventRecord) -> AcquisitionRecord | None:
    """The highest epoch acquired before the episode's latest condition."""
    best: AcquisitionRecord | None = None
    for a in state.acqs:
        if (before(a, last) or a.event_id == last.event_id) and (
            best is None or a.epoch > best.epoch
        ):
            best = a
    return best


def worker_of(state: WorkflowState, epoch: int) -> str | None:
    """Who acted under `epoch`, when its acquisition is not (or no longer) known."""
    first = earliest(e for e in state.evidence if e.epoch == epoch and e.source != "verifier")
    return None if first is None else first.worker_id
