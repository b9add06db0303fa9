"""The detection rules of DESIGN §4, as pure functions of one workflow's retained evidence.

Derivation is monotone: more evidence can only add conditions, so merging every evaluation into
the episode (keeping the earliest witness of each condition) gives the same findings whatever
the arrival order, when events carry `seq`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from detector.events import Kind, Source
from detector.findings import ConditionKind

from ._records import Acq, Cond, Ev, before, order_key
from ._state import EpisodeKey, WorkflowState

STALE_CONDITION: Final[dict[str, ConditionKind]] = {
    Kind.PROGRESS: ConditionKind.STALE_ACTIVITY,
    Kind.HEARTBEAT: ConditionKind.STALE_ACTIVITY,
    Kind.EFFECT_ATTEMPTED: ConditionKind.STALE_EFFECT_ATTEMPT,
    Kind.EFFECT_COMMITTED: ConditionKind.STALE_EFFECT_COMMITTED,
    Kind.EFFECT_REJECTED: ConditionKind.STALE_EFFECT_REJECTED,
}
# Evidence that the displaced owner knows it lost, or stopped, or that a fence held against it.
_FENCE_KINDS: Final = frozenset({Kind.LEASE_LOST, Kind.LEASE_RELEASED})


@dataclass(slots=True)
class Derived:
    """What one evaluation found for one episode."""

    conditions: list[Cond] = field(default_factory=list)
    stale: list[Ev] = field(default_factory=list)


def displacing(acqs: Iterable[Acq], ev: Ev) -> Acq | None:
    """The first acquisition of a higher epoch that happened before `ev`, if any."""
    found: Acq | None = None
    for a in acqs:
        if (
            a.epoch > ev.epoch
            and before(a, ev)
            and (found is None or order_key(a) < order_key(found))
        ):
            found = a
    return found


def _cond(
    kind: ConditionKind, ev: Ev, cause: str | None = None, epochs: tuple[int, ...] | None = None
) -> Cond:
    return Cond(
        kind, ev.event_id, ev.seq, ev.pos, ev.effect_key, cause, epochs, ev.source, ev.trace
    )


def derive(state: WorkflowState, new: Ev | None = None) -> dict[EpisodeKey, Derived]:
    """Every condition the retained evidence supports, grouped by episode.

    With `new`, only what that one event can add: an event (unlike an acquisition) changes no
    other event's standing, and earlier conditions are already merged into the episodes.
    """
    out: dict[EpisodeKey, Derived] = {}
    top = state.top
    evidence = state.evidence if new is None else (new,)
    for ev in evidence:
        cond_kind = STALE_CONDITION.get(ev.kind)
        if cond_kind is None or ev.epoch >= top or displacing(state.acqs, ev) is None:
            continue
        d = out.setdefault((ev.epoch, False), Derived())
        d.stale.append(ev)
        d.conditions.append(_cond(cond_kind, ev))
    commits = state.evidence
    if new is not None:
        if new.kind != Kind.EFFECT_COMMITTED:
            return out
        commits = tuple(e for e in state.evidence if e.effect_key == new.effect_key)
    for key, cond in _duplicates(commits):
        out.setdefault(key, Derived()).conditions.append(cond)
    return out


def _duplicates(effects: Iterable[Ev]) -> Iterator[tuple[EpisodeKey, Cond]]:
    """Failover duplicates (two epochs) and retry duplicates (one epoch, one source, two events)."""
    first: dict[tuple[str, int], Ev] = {}
    confirmed: set[tuple[str, int]] = set()
    by_source: dict[tuple[str, int, str], list[Ev]] = {}
    for ev in effects:
        if ev.kind != Kind.EFFECT_COMMITTED or ev.effect_key is None:
            continue
        k = (ev.effect_key, ev.epoch)
        if k not in first or order_key(ev) < order_key(first[k]):
            first[k] = ev
        if ev.source == Source.DESTINATION:
            confirmed.add(k)
        by_source.setdefault((ev.effect_key, ev.epoch, ev.source), []).append(ev)
    for (effect_key, epoch), ev in first.items():
        for (other_key, other_epoch), other in first.items():
            if other_key != effect_key or other_epoch <= epoch:
                continue
            cond = _cond(
                ConditionKind.DUPLICATE_EFFECT,
                max(ev, other, key=order_key),
                "failover",
                (epoch, other_epoch),
            )
            # Confirmed when a destination confirmed the effect under both epochs, whichever of
            # their commits came first: the same answer in any arrival order.
            both = {(effect_key, epoch), (effect_key, other_epoch)} <= confirmed
            source = Source.DESTINATION if both else Source.WORKER
            yield (epoch, False), cond._replace(source=source.value)
    for (_, epoch, _), evs in by_source.items():
        if len({e.event_id for e in evs}) > 1:
            second = sorted(evs, key=order_key)[1]
            yield (epoch, True), _cond(ConditionKind.DUPLICATE_EFFECT, second, "retry", (epoch,))


def fenced_after(state: WorkflowState, epoch: int, last: Ev | Cond) -> bool:
    """Is there evidence, at or after `last`, that `epoch` knows it lost or was fenced?

    A destination's rejection is both stale evidence and a fence: when it is the latest stale
    event, it fences the epoch itself.
    """
    for ev in state.evidence:
        if ev.epoch != epoch or before(ev, last):
            continue
        if ev.kind in _FENCE_KINDS or (
            ev.kind == Kind.EFFECT_REJECTED and ev.source == Source.DESTINATION
        ):
            return True
    return False


def verified_after(state: WorkflowState, effect_key: str, last: Cond) -> bool:
    """Has a verifier confirmed the intended result of `effect_key` after its latest condition?"""
    return any(
        ev.kind == Kind.OUTCOME_VERIFIED
        and ev.source == Source.VERIFIER
        and ev.effect_key == effect_key
        and before(last, ev)
        for ev in state.evidence
    )


def acquisition(state: WorkflowState, epoch: int) -> Acq | None:
    for a in state.acqs:
        if a.epoch == epoch:
            return a
    return None


def current_owner_before(state: WorkflowState, last: Ev | Cond) -> Acq | None:
    """The highest epoch acquired before the episode's latest condition."""
    best: Acq | None = None
    for a in state.acqs:
        if (before(a, last) or a.event_id == last.event_id) and (
            best is None or a.epoch > best.epoch
        ):
            best = a
    return best


def transition_of(state: WorkflowState, displaced_epoch: int) -> Acq | None:
    """The acquisition that displaced the epoch: the lowest higher epoch acquired."""
    for a in state.acqs:
        if a.epoch > displaced_epoch:
            return a
    return None


def worker_of(state: WorkflowState, epoch: int) -> str | None:
    """Who acted under `epoch`, when its acquisition is not (or no longer) known."""
    acting = [e for e in state.evidence if e.epoch == epoch and e.source != Source.VERIFIER]
    return min(acting, key=order_key).worker_id if acting else None
