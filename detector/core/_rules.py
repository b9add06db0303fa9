"""The detection rules of DESIGN §4 as pure questions about one workflow's state.

Each answers in time independent of how many conditions or keys a finding holds: staleness by a
binary search over the acquisitions' suffix minima, fences and verifications by `Marks`.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Final

from detector.contracts.events import Kind
from detector.contracts.findings import ConditionKind

from ._records import AcquisitionRecord, EventRecord, any_at_or_after, before, earliest
from ._state import WorkflowState

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
    """Is some acquisition of a higher epoch before the point (seq, pos)?"""
    epochs, min_seq, min_unseq, min_pos = _index(state)
    i = bisect_right(epochs, epoch)
    if seq is not None:
        return min_seq[i] < seq or min_unseq[i] < pos
    return min_pos[i] < pos


def displacing(state: WorkflowState, ev: EventRecord) -> AcquisitionRecord | None:
    """The stale event's transition: the earliest acquisition of a higher epoch before it."""
    return earliest(a for a in state.acqs if a.epoch > ev.epoch and before(a, ev))


def first_higher(state: WorkflowState, epoch: int) -> AcquisitionRecord | None:
    """The earliest acquisition of a higher epoch: the handoff of an owner that never acted
    after it."""
    return earliest(a for a in state.acqs if a.epoch > epoch)


def fenced_after(state: WorkflowState, epoch: int, last: EventRecord) -> bool:
    """Did `epoch` show it knew it lost, or hit a fence, at or after `last`?"""
    fences = state.fences
    m = None if fences is None else fences.get(epoch)
    return m is not None and any_at_or_after(m, last.seq, last.pos)


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
