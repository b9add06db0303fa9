"""The detection rules of DESIGN §4 as pure questions about one workflow's state.

Each answers in time independent of how many conditions or keys a finding holds: staleness by a
binary search over the acquisitions' suffix minima, verifications by `Marks`, fences by a few
points tested against the extremes of the episode's stale events (`Latest`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Final

from detector.contracts.events import Kind
from detector.contracts.findings import ConditionKind

from ._records import (
    AcquisitionRecord,
    EventRecord,
    Latest,
    Ordered,
    before,
    earlier,
    earliest,
)
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
_ACQUIRED: Final = Kind.LEASE_ACQUIRED.value


def _index(state: WorkflowState) -> tuple[list[int], list[int], list[int], list[int]]:
    """Epochs ascending, and from each index on: the lowest seq, the lowest arrival of an
    acquisition without seq, and the lowest arrival (each list ends with `_NEVER`)."""
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


def appended(state: WorkflowState) -> None:
    """The last acquisition is a new highest epoch: extend the index instead of rebuilding it.
    Only the suffixes it lowers change, and acquisitions usually come in order: none does."""
    index = state.index
    if index is None:
        return
    a = state.acqs[-1]
    epochs, min_seq, min_unseq, min_pos = index
    epochs.append(a.epoch)
    for suffix, value in (
        (min_seq, _NEVER if a.seq is None else a.seq),
        (min_unseq, _NEVER if a.seq is not None else a.pos),
        (min_pos, a.pos),
    ):
        suffix.insert(len(suffix) - 1, value)
        i = len(suffix) - 3
        while i >= 0 and suffix[i] > value:
            suffix[i] = value
            i -= 1


def _values(a: AcquisitionRecord) -> tuple[int, int, int]:
    return (_NEVER if a.seq is None else a.seq, _NEVER if a.seq is not None else a.pos, a.pos)


def inserted(state: WorkflowState, i: int) -> None:
    """An acquisition was inserted at `i`, below the highest epoch (it arrived late): only the
    suffixes up to it can go down, and a walk stops at the first that does not. Newest first,
    each lands at the front: a step each."""
    index = state.index
    if index is None:
        return
    a = state.acqs[i]
    index[0].insert(i, a.epoch)
    for suffix, value in zip(index[1:], _values(a), strict=True):
        suffix.insert(i, min(value, suffix[i]))
        _lower(suffix, i - 1, value)


def replaced(state: WorkflowState, i: int, old: AcquisitionRecord) -> None:
    """The acquisition at `i` took the place of an earlier one of its epoch, `old`."""
    index = state.index
    if index is None:
        return
    new = _values(state.acqs[i])
    if any(n > o for n, o in zip(new, _values(old), strict=True)):
        state.index = None  # a suffix can go up: built again when next asked (rare)
        return
    for suffix, value in zip(index[1:], new, strict=True):
        suffix[i] = min(value, suffix[i + 1])
        _lower(suffix, i - 1, value)


def _lower(suffix: list[int], i: int, value: int) -> None:
    while i >= 0 and suffix[i] > value:
        suffix[i] = value
        i -= 1


def dropped_first(state: WorkflowState, n: int) -> None:
    """The `n` lowest epochs' acquisitions were dropped: the suffixes after them still hold."""
    index = state.index
    if index is not None:
        for part in index:
            del part[:n]


def displaced(state: WorkflowState, epoch: int, seq: int | None, pos: int) -> bool:
    """Is some acquisition of a higher epoch before the event at (seq, pos)? (At one seq an
    acquisition comes first.)"""
    epochs, min_seq, min_unseq, min_pos = _index(state)
    i = bisect_right(epochs, epoch)
    if seq is not None:
        return min_seq[i] <= seq or min_unseq[i] < pos
    return min_pos[i] < pos


def after_takeover(state: WorkflowState, ev: EventRecord) -> bool:
    """Is some acquisition of a higher epoch before `ev`? An acquisition kept as a raw event is
    one among the acquisitions at its seq, ordered by event id: the index cannot tell those."""
    if not displaced(state, ev.epoch, ev.seq, ev.pos):
        return False
    if ev.kind != _ACQUIRED or ev.seq is None:
        return True
    return _earliest_above(state, ev.epoch, ev) is not None


def _earliest_above(
    state: WorkflowState, epoch: int, ev: Ordered | None
) -> AcquisitionRecord | None:
    """The earliest acquisition of an epoch above `epoch` (before `ev`, when given). The walk
    goes up the epochs and stops once no later acquisition can come before the one found: the
    same answer as looking at them all, in a step or two when acquisitions come in order."""
    epochs, min_seq, min_unseq, min_pos = _index(state)
    acqs = state.acqs
    found: AcquisitionRecord | None = None
    for i in range(bisect_right(epochs, epoch), len(acqs)):
        if found is not None and (
            min_pos[i] > found.pos
            if found.seq is None
            else min_seq[i] > found.seq and min_unseq[i] > found.pos
        ):
            break
        a = acqs[i]
        if ev is None or before(a, ev):
            found = a if found is None else earlier(found, a)
    return found


def displacing(state: WorkflowState, epoch: int, ev: Ordered) -> AcquisitionRecord | None:
    """The transition of an event of `epoch` (a condition's witness): the earliest acquisition
    of a higher epoch before it."""
    return _earliest_above(state, epoch, ev)


# Fence points kept per epoch: a frontier of those with seq, sorted by seq (ties by event id),
# whose arrivals then fall (none is at or after another in both), and one for the latest without
# seq. Past this many, which takes a flood of fences arriving against their seq order, the middle
# ones are dropped, and the finding says so.
FENCE_POINTS: Final = 1024
_AT: Final = itemgetter(0, 1)  # a fence point's place by seq: (seq, event id)


def add_fence(points: list[FencePoint], seq: int | None, eid: str, pos: int) -> int:
    """Add a fence: 0 when it changes nothing, 1 when it does, 2 when points were dropped. An
    insertion is a bisection (as `_episode._pend` keeps the occurrences awaiting a verifier)."""
    n = len(points)
    m = n - 1 if n and points[-1][0] is None else n  # points[:m] have a seq
    if seq is None:
        if m == n:
            points.append((None, eid, pos))
        elif points[-1][2] < pos:
            points[-1] = (None, eid, pos)
        else:
            return 0
        return 1
    at = (seq, eid)
    i = bisect_left(points, at, hi=m, key=_AT)
    if i < m and points[i][2] >= pos:
        return 0  # as late by seq and by arrival: this fence adds nothing
    end = i + 1 if i < m and _AT(points[i]) == at else i
    start = i
    while start > 0 and points[start - 1][2] <= pos:
        start -= 1
    points[start:end] = [(seq, eid, pos)]
    m += 1 - (end - start)
    if m <= FENCE_POINTS:
        return 1
    del points[1 : m - 1]  # the latest by seq and the latest arrival stay
    return 2


def fenced(state: WorkflowState, epoch: int, stale: Latest) -> bool:
    """Did `epoch` show it knew it lost, or hit a fence, not before any of its stale events?"""
    fences = state.fences
    points = None if fences is None else fences.get(epoch)
    if not points:
        return False
    if points[-1][0] is None and stale.last.pos <= points[-1][2]:
        return True  # a fence without seq that arrived after every stale event
    m = len(points) - 1 if points[-1][0] is None else len(points)
    top = stale.top
    # The first point at or after the last stale event by seq has the latest arrival of those.
    i = 0 if top is None else bisect_left(points, (top.seq, top.event_id), hi=m, key=_AT)
    return i < m and stale.unseq <= points[i][2]


def acquisition(state: WorkflowState, epoch: int) -> AcquisitionRecord | None:
    epochs = _index(state)[0]
    i = bisect_left(epochs, epoch)
    return state.acqs[i] if i < len(epochs) and epochs[i] == epoch else None


def current_owner_before(state: WorkflowState, last: EventRecord) -> AcquisitionRecord | None:
    """The highest epoch acquired before the episode's latest condition. A bisection over the
    suffix minima finds the highest epoch that may be (a tie of `seq` may or may not be), and
    the walk down from there is a step or two: it costs the same for the first finding of a
    workflow and for its thousandth."""
    _, min_seq, min_unseq, min_pos = _index(state)
    acqs = state.acqs
    seq, pos = last.seq, last.pos
    lo, hi = 0, len(acqs)
    while lo < hi:  # the first suffix that holds no acquisition before `last`
        mid = (lo + hi) // 2
        if min_seq[mid] <= seq or min_unseq[mid] < pos if seq is not None else min_pos[mid] < pos:
            lo = mid + 1
        else:
            hi = mid
    for i in range(lo - 1, -1, -1):
        a = acqs[i]
        if before(a, last) or a.event_id == last.event_id:
            return a
    return None


def worker_of(state: WorkflowState, epoch: int) -> str | None:
    """Who acted under `epoch`, when its acquisition is not (or no longer) known."""
    first = earliest(e for e in state.evidence if e.epoch == epoch and e.source != "verifier")
    return None if first is None else first.worker_id
