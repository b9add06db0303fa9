"""What an event adds to its workflow's episodes: a stale event's condition, and the duplicates
of a commit (DESIGN §4 "Conditions")."""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Final

from detector.contracts.events import Kind, Source
from detector.contracts.findings import ConditionKind

from ._episode import BIT, add_condition, replace_duplicate
from ._records import (
    NONE,
    ConditionRecord,
    EventRecord,
    before,
    earlier,
    extend,
    later,
    new_record,
)
from ._rules import STALE_CONDITION
from ._state import Effect, Episode, WorkflowState

_COMMITTED: Final = Kind.EFFECT_COMMITTED.value
_DESTINATION: Final = Source.DESTINATION.value
# Activity is one condition per episode, whatever key it carries (DESIGN §4).
_ACTIVITY_KINDS: Final = frozenset({Kind.HEARTBEAT.value, Kind.PROGRESS.value})
# `Effect.lasts` slots of a commit, one per source (`keep_last`).
_COMMIT_SLOTS: Final = tuple(f"{_COMMITTED}:{source.value}" for source in Source)
_FAILOVER_BIT: Final = BIT[(ConditionKind.DUPLICATE_EFFECT, "failover")]


def add_stale(
    workflow: WorkflowState, ev: EventRecord, at: float | None, uncertain: bool, max_keys: int
) -> Episode:
    """Evidence of a displaced epoch after the takeover: a condition of its episode."""
    condition_kind = STALE_CONDITION[ev.kind]
    activity = ev.kind in _ACTIVITY_KINDS
    key = None if activity else ev.effect_key
    episode = workflow.episode((ev.epoch, False))
    if episode.first_stale is None or before(ev, episode.first_stale):
        episode.worker = ev.worker_id  # the first stale event's: the same in any arrival order
    condition = new_record(
        ConditionRecord,
        (
            condition_kind,
            ev.event_id,
            ev.seq,
            ev.pos,
            key,
            None,
            None,
            ev.source,
            ev.trace,
            None,
            False,
        ),
    )
    effect = None if key is None or workflow.effects is None else workflow.effects.get(key)
    add_condition(episode, condition, ev, None if effect is None else effect.verified, max_keys)
    episode.first_stale = ev if episode.first_stale is None else earlier(episode.first_stale, ev)
    episode.stale = extend(episode.stale, ev)
    if at is not None:
        episode.last_stale_at = at  # the displaced owner acted: silence starts again
    if uncertain:
        episode.truncated = True
    return episode


def add_commit(
    workflow: WorkflowState, effect: Effect, ev: EventRecord, uncertain: bool, max_keys: int
) -> list[Episode]:
    """Duplicates: the key committed under two epochs, or twice by one source of one."""
    touched: list[Episode] = []
    key = ev.effect_key
    assert key is not None  # a commit's key (`Intake.ingest`)
    first = effect.firsts.get(ev.epoch)
    if first is None or before(ev, first):
        effect.firsts[ev.epoch] = ev
    if ev.source == _DESTINATION:
        if effect.confirmed is None:
            effect.confirmed = set()
        effect.confirmed.add(ev.epoch)
    # The key's duplicates are between the epochs that committed it next to each other
    # (DESIGN §4): a commit adds to at most the pair below its epoch and the pair above.
    epoch = ev.epoch
    order = effect.order
    if order is None:
        order = effect.order = sorted(effect.firsts)
    elif first is None:
        if not order or epoch > order[-1]:
            order.append(epoch)  # the usual case: the key's newest owner
        else:
            insort(order, epoch)
    i = bisect_left(order, epoch)
    below = order[i - 1] if i else None
    above = order[i + 1] if i + 1 < len(order) else None
    if below is not None:
        if first is None and above is not None:
            # An epoch between two that committed the key, arriving late: the pair of
            # those two gives way to the two pairs with it.
            touched.append(_repartner(workflow, effect, key, below, epoch, above, uncertain))
        else:
            touched.append(_duplicate(workflow, effect, ev, below, epoch, uncertain, max_keys))
    if above is not None:
        touched.append(_duplicate(workflow, effect, ev, epoch, above, uncertain, max_keys))
    pair = effect.twice.setdefault((ev.epoch, ev.source), [])
    if all(p.event_id != ev.event_id for p in pair):
        pair.append(ev)
        if len(pair) > 1 and before(pair[-1], pair[-2]):
            pair[-1], pair[-2] = pair[-2], pair[-1]
        if len(pair) > 2 and before(pair[1], pair[0]):
            pair[0], pair[1] = pair[1], pair[0]
        del pair[2:]
    if len(pair) == 2:
        second = pair[1]
        condition = new_record(
            ConditionRecord,
            (
                ConditionKind.DUPLICATE_EFFECT,
                second.event_id,
                second.seq,
                second.pos,
                key,
                "retry",
                (ev.epoch,),
                second.source,
                second.trace,
                (pair[0].worker_id, second.worker_id),
                pair[0].seq is not None and second.seq is not None,
            ),
        )
        episode = workflow.episode((ev.epoch, True))
        if episode.worker is None:
            episode.worker = second.worker_id
        latest = effect.lasts[(ev.epoch, f"{_COMMITTED}:{ev.source}")]
        for occurrence in dict.fromkeys((ev, pair[0], second, latest)):  # as for a failover
            add_condition(episode, condition, occurrence, effect.verified, max_keys)
        episode.truncated |= uncertain
        touched.append(episode)
    return touched


def _duplicate(
    workflow: WorkflowState,
    effect: Effect,
    ev: EventRecord,
    lo: int,
    hi: int,
    uncertain: bool,
    max_keys: int,
) -> Episode:
    """The key committed under `lo` and under `hi`, the next epoch that committed it: a
    failover duplicate in `lo`'s episode, of which `ev` (a commit of either) occurs."""
    condition = _failover(effect, lo, hi)
    episode = workflow.episode((lo, False))
    if episode.worker is None:
        episode.worker = effect.firsts[lo].worker_id
    # Every commit of either epoch is an occurrence of the duplicate: without a total
    # order, the last one and what a verification must come after are among these.
    for occurrence in dict.fromkeys((ev, *_pair_commits(effect, lo, hi))):
        add_condition(episode, condition, occurrence, effect.verified, max_keys, dup=True)
    episode.truncated |= uncertain
    return episode


def _repartner(
    workflow: WorkflowState, effect: Effect, key: str, lo: int, mid: int, hi: int, uncertain: bool
) -> Episode:
    """`mid` committed the key after `lo` and `hi` did: `lo`'s duplicate of the key is now
    with `mid`, and ends as if the pair with `hi` had never been added. A rare case (an
    out-of-order commit), bounded: constant unless `hi`'s commits were the episode's latest
    conditions, which are then gathered again from its stale events and its duplicates."""
    condition = _failover(effect, lo, mid)
    episode = workflow.episode((lo, False))
    commits = _pair_commits(effect, lo, mid)
    both = effect.confirmed is not None and {lo, mid} <= effect.confirmed
    replace_duplicate(episode, condition, commits, effect.verified, both)
    latest = episode.latest
    if latest is not None and (
        latest.unseq != NONE or any(_commit_of(r, hi, key) for r in (latest.top, latest.last))
    ):
        latest = episode.stale  # what the episode holds apart from its duplicates
        for k, bits in episode.keys.items():
            other = None if workflow.effects is None else workflow.effects.get(k)
            if bits & _FAILOVER_BIT and other is not None:
                order = other.order
                if order is None:
                    order = other.order = sorted(other.firsts)
                j = bisect_left(order, lo) + 1
                if j < len(order) and order[j - 1] == lo:
                    for r in _pair_commits(other, lo, order[j]):
                        latest = extend(latest, r)
    for r in commits:
        latest = extend(latest, r)
    episode.latest = latest
    episode.truncated |= uncertain
    return episode


def keep_last(effect: Effect, ev: EventRecord) -> None:
    """The latest effect of its kind per epoch (commits also per source: a retry is two commits
    from one source)."""
    kind = ev.kind
    slot = (ev.epoch, kind if kind != _COMMITTED else f"{kind}:{ev.source}")
    last = effect.lasts.get(slot)
    if last is None or before(last, ev):
        effect.lasts[slot] = ev


def _last_commit(effect: Effect, epoch: int) -> EventRecord:
    """The latest commit of the key under `epoch`, from any source (there is at least one):
    a look-up per source, however many epochs committed the key."""
    found: EventRecord | None = None
    for slot in _COMMIT_SLOTS:
        ev = effect.lasts.get((epoch, slot))
        if ev is not None:
            found = ev if found is None else later(found, ev)
    assert found is not None
    return found


def _failover(effect: Effect, lo: int, hi: int) -> ConditionRecord:
    """The failover duplicate of a key committed under `lo` and then `hi`, witnessed by the later
    of their first commits; confirmed when a destination confirmed the effect under both,
    whichever of their commits came first (the same answer in any arrival order)."""
    f_lo, f_hi = effect.firsts[lo], effect.firsts[hi]
    witness = later(f_lo, f_hi)
    both = effect.confirmed is not None and {lo, hi} <= effect.confirmed
    return new_record(
        ConditionRecord,
        (
            ConditionKind.DUPLICATE_EFFECT,
            witness.event_id,
            witness.seq,
            witness.pos,
            witness.effect_key,
            "failover",
            (lo, hi),
            _DESTINATION if both else Source.WORKER.value,
            witness.trace,
            (f_lo.worker_id, f_hi.worker_id),
            False,
        ),
    )


def _pair_commits(effect: Effect, lo: int, hi: int) -> tuple[EventRecord, ...]:
    """The commits of the key under two epochs that stand for all of them, derived from its
    `Effect` alone: the first and the latest of each."""
    return tuple(
        dict.fromkeys(
            (
                effect.firsts[lo],
                effect.firsts[hi],
                _last_commit(effect, lo),
                _last_commit(effect, hi),
            )
        )
    )


def _commit_of(r: EventRecord | None, epoch: int, key: str) -> bool:
    return r is not None and r.epoch == epoch and r.effect_key == key and r.kind == _COMMITTED
