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
    st: WorkflowState, ev: EventRecord, at: float | None, uncertain: bool, cap: int
) -> Episode:
    """Evidence of a displaced epoch after the takeover: a condition of its episode."""
    ckind = STALE_CONDITION[ev.kind]
    activity = ev.kind in _ACTIVITY_KINDS
    key = None if activity else ev.effect_key
    ep = st.episode((ev.epoch, False))
    if ep.first_stale is None or before(ev, ep.first_stale):
        ep.worker = ev.worker_id  # the first stale event's: the same in any arrival order
    cond = new_record(
        ConditionRecord,
        (ckind, ev.event_id, ev.seq, ev.pos, key, None, None, ev.source, ev.trace, None, False),
    )
    eff = None if key is None or st.effects is None else st.effects.get(key)
    add_condition(ep, cond, ev, None if eff is None else eff.verified, cap)
    ep.first_stale = ev if ep.first_stale is None else earlier(ep.first_stale, ev)
    ep.stale = extend(ep.stale, ev)
    if at is not None:
        ep.last_stale_at = at  # the displaced owner acted: silence starts again
    if uncertain:
        ep.truncated = True
    return ep


def add_commit(
    st: WorkflowState, eff: Effect, ev: EventRecord, uncertain: bool, cap: int
) -> list[Episode]:
    """Duplicates: the key committed under two epochs, or twice by one source of one."""
    touched: list[Episode] = []
    key = ev.effect_key
    assert key is not None  # a commit's key (`Intake.ingest`)
    first = eff.firsts.get(ev.epoch)
    if first is None or before(ev, first):
        eff.firsts[ev.epoch] = ev
    if ev.source == _DESTINATION:
        if eff.confirmed is None:
            eff.confirmed = set()
        eff.confirmed.add(ev.epoch)
    # The key's duplicates are between the epochs that committed it next to each other
    # (DESIGN §4): a commit adds to at most the pair below its epoch and the pair above.
    epoch = ev.epoch
    order = eff.order
    if order is None:
        order = eff.order = sorted(eff.firsts)
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
            touched.append(_repartner(st, eff, key, below, epoch, above, uncertain))
        else:
            touched.append(_duplicate(st, eff, ev, below, epoch, uncertain, cap))
    if above is not None:
        touched.append(_duplicate(st, eff, ev, epoch, above, uncertain, cap))
    pair = eff.twice.setdefault((ev.epoch, ev.source), [])
    if all(p.event_id != ev.event_id for p in pair):
        pair.append(ev)
        if len(pair) > 1 and before(pair[-1], pair[-2]):
            pair[-1], pair[-2] = pair[-2], pair[-1]
        if len(pair) > 2 and before(pair[1], pair[0]):
            pair[0], pair[1] = pair[1], pair[0]
        del pair[2:]
    if len(pair) == 2:
        second = pair[1]
        cond = new_record(
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
        ep = st.episode((ev.epoch, True))
        if ep.worker is None:
            ep.worker = second.worker_id
        latest = eff.lasts[(ev.epoch, f"{_COMMITTED}:{ev.source}")]
        for occurrence in dict.fromkeys((ev, pair[0], second, latest)):  # as for a failover
            add_condition(ep, cond, occurrence, eff.verified, cap)
        ep.truncated |= uncertain
        touched.append(ep)
    return touched


def _duplicate(
    st: WorkflowState,
    eff: Effect,
    ev: EventRecord,
    lo: int,
    hi: int,
    uncertain: bool,
    cap: int,
) -> Episode:
    """The key committed under `lo` and under `hi`, the next epoch that committed it: a
    failover duplicate in `lo`'s episode, of which `ev` (a commit of either) occurs."""
    cond = _failover(eff, lo, hi)
    ep = st.episode((lo, False))
    if ep.worker is None:
        ep.worker = eff.firsts[lo].worker_id
    # Every commit of either epoch is an occurrence of the duplicate: without a total
    # order, the last one and what a verification must come after are among these.
    for occurrence in dict.fromkeys((ev, *_pair_commits(eff, lo, hi))):
        add_condition(ep, cond, occurrence, eff.verified, cap, dup=True)
    ep.truncated |= uncertain
    return ep


def _repartner(
    st: WorkflowState, eff: Effect, key: str, lo: int, mid: int, hi: int, uncertain: bool
) -> Episode:
    """`mid` committed the key after `lo` and `hi` did: `lo`'s duplicate of the key is now
    with `mid`, and ends as if the pair with `hi` had never been added. A rare case (an
    out-of-order commit), bounded: constant unless `hi`'s commits were the episode's latest
    conditions, which are then gathered again from its stale events and its duplicates."""
    cond = _failover(eff, lo, mid)
    ep = st.episode((lo, False))
    commits = _pair_commits(eff, lo, mid)
    both = eff.confirmed is not None and {lo, mid} <= eff.confirmed
    replace_duplicate(ep, cond, commits, eff.verified, both)
    latest = ep.latest
    if latest is not None and (
        latest.unseq != NONE or any(_commit_of(r, hi, key) for r in (latest.top, latest.last))
    ):
        latest = ep.stale  # what the episode holds apart from its duplicates
        for k, bits in ep.keys.items():
            other = None if st.effects is None else st.effects.get(k)
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
    ep.latest = latest
    ep.truncated |= uncertain
    return ep


def keep_last(eff: Effect, ev: EventRecord) -> None:
    """The latest effect of its kind per epoch (commits also per source: a retry is two commits
    from one source)."""
    kind = ev.kind
    slot = (ev.epoch, kind if kind != _COMMITTED else f"{kind}:{ev.source}")
    last = eff.lasts.get(slot)
    if last is None or before(last, ev):
        eff.lasts[slot] = ev


def _last_commit(eff: Effect, epoch: int) -> EventRecord:
    """The latest commit of the key under `epoch`, from any source (there is at least one):
    a look-up per source, however many epochs committed the key."""
    found: EventRecord | None = None
    for slot in _COMMIT_SLOTS:
        ev = eff.lasts.get((epoch, slot))
        if ev is not None:
            found = ev if found is None else later(found, ev)
    assert found is not None
    return found


def _failover(eff: Effect, lo: int, hi: int) -> ConditionRecord:
    """The failover duplicate of a key committed under `lo` and then `hi`, witnessed by the later
    of their first commits; confirmed when a destination confirmed the effect under both,
    whichever of their commits came first (the same answer in any arrival order)."""
    f_lo, f_hi = eff.firsts[lo], eff.firsts[hi]
    witness = later(f_lo, f_hi)
    both = eff.confirmed is not None and {lo, hi} <= eff.confirmed
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


def _pair_commits(eff: Effect, lo: int, hi: int) -> tuple[EventRecord, ...]:
    """The commits of the key under two epochs that stand for all of them, derived from its
    `Effect` alone: the first and the latest of each."""
    return tuple(
        dict.fromkeys(
            (eff.firsts[lo], eff.firsts[hi], _last_commit(eff, lo), _last_commit(eff, hi))
        )
    )


def _commit_of(r: EventRecord | None, epoch: int, key: str) -> bool:
    return r is not None and r.epoch == epoch and r.effect_key == key and r.kind == _COMMITTED
