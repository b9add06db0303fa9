"""Adding a condition to an episode in constant time, however large the finding already is.

An episode lists a bounded number of conditions (the earliest witnesses, every kind at least
once) and effect keys (the first, sorted), and keeps per key only a bit set of its conditions
and the occurrences still waiting for a verifier.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from functools import cmp_to_key
from operator import itemgetter
from typing import Final

from detector.contracts.events import Source
from detector.contracts.findings import ConditionKind

from ._records import ConditionRecord, EventRecord, Marks, any_after, before, extend
from ._state import Episode, Point

LISTED: Final = 20  # conditions a revision lists; the rest are counted
# Candidates an episode keeps for listing: the `LISTED` earliest, and as many next ones. A failover
# duplicate's witness can move later (`replace_duplicate`), and the conditions it kept out of
# the list must then be there to take its place.
KEPT: Final = 2 * LISTED
SHOWN_KEYS: Final = 20  # effect keys a revision lists
_FRONTIER: Final = 1024  # unverified occurrences kept per key before they are merged
_AT: Final = itemgetter(0, 2)  # a pending point's place by seq: (seq, event id)

_ATTEMPT: Final = 1
_COMMITTED: Final = 2
_REJECTED: Final = 4
_FAILOVER: Final = 8
BIT: Final[dict[tuple[ConditionKind, str | None], int]] = {
    (ConditionKind.STALE_EFFECT_ATTEMPT, None): _ATTEMPT,
    (ConditionKind.STALE_EFFECT_COMMITTED, None): _COMMITTED,
    (ConditionKind.STALE_EFFECT_REJECTED, None): _REJECTED,
    (ConditionKind.DUPLICATE_EFFECT, "failover"): _FAILOVER,
    (ConditionKind.DUPLICATE_EFFECT, "retry"): 16,
}
_CONFIRMABLE: Final = _COMMITTED | _REJECTED | 8 | 16  # the destination's word settles them
_CONFIRMED_SHIFT: Final = 8
_DESTINATION: Final = Source.DESTINATION.value


def _better(c: ConditionRecord, old: ConditionRecord) -> bool:
    """Is `c` the better witness? The earlier event; one commit can witness duplicates with
    several epochs: the lowest epochs win."""
    return before(c, old) or (not before(old, c) and (c.epochs or ()) < (old.epochs or ()))


def outcome(bits: int) -> str:
    """What happened to a key, by its conditions: committed (by a stale commit or a duplicate),
    else rejected (the fence held), else attempted."""
    if bits & (_COMMITTED | 8 | 16):
        return "committed"
    return "rejected" if bits & _REJECTED else "attempted"


def rejected(bits: int) -> bool:
    """Did a destination reject the displaced epoch on this key (the fence held)?"""
    return bool(bits & _REJECTED)


def _unanswered(bits: int) -> int:
    return int(bool(bits & _ATTEMPT) and not bits & _REJECTED)


def add_condition(
    ep: Episode,
    cond: ConditionRecord,
    occurrence: EventRecord,
    verified: Marks | None,
    cap: int,
    dup: bool = False,
) -> None:
    """Account for one occurrence of a condition (a repeat counts: it can reopen the finding).

    `verified` is the key's verifications so far; `cap` bounds the keys an episode tracks. A
    failover duplicate's occurrences (`dup`) wait for a verifier apart (`Episode.dup_pending`).
    """
    ep.changes += 1
    ep.latest = extend(ep.latest, occurrence)
    key = cond.effect_key
    if cond.kind is ConditionKind.STALE_ACTIVITY or key is None:
        if not ep.activity:
            ep.activity = True
            ep.total += 1
        _list(ep, cond)
        return
    old = ep.keys.get(key)
    if old is None and len(ep.keys) >= cap:
        # Beyond the cap the key cannot be tracked: it can never be shown verified.
        ep.keys_over += 1
        ep.truncated = True
        return
    bits = old or 0
    bit = BIT[(cond.kind, cond.cause)]
    new = bits | bit
    if not bits & bit:
        ep.total += 1
        if bit & _CONFIRMABLE:
            ep.confirmations += 1
            ep.unconfirmed += 1
    if bit & _CONFIRMABLE and cond.source == _DESTINATION and not bits & (bit << _CONFIRMED_SHIFT):
        new |= bit << _CONFIRMED_SHIFT
        ep.unconfirmed -= 1
    ep.unanswered += _unanswered(new) - _unanswered(bits)
    ep.keys[key] = new
    if old is None:
        _show(ep.shown, key)
    point = (occurrence.seq, occurrence.pos, occurrence.event_id)
    if verified is None or not any_after(verified, *point):
        _pend(ep, (ep.dup_pending if dup else ep.pending).setdefault(key, []), point)
    _list(ep, cond)


def replace_duplicate(
    ep: Episode,
    cond: ConditionRecord,
    occurrences: Iterable[EventRecord],
    verified: Marks | None,
    confirmed: bool,
) -> None:
    """The failover duplicate of `cond.effect_key` in this episode now pairs its epoch with
    another (an epoch between the two committed the key, and arrived late: DESIGN §4): what the
    former pair added is replaced, as if it had never been added. Its listed witness, its
    confirmation and its occurrences awaiting a verifier are the key's alone, rebuilt here in
    constant time; the episode's `latest` is its caller's (`_conditions._repartner`). A key beyond
    the episode's cap was only counted: the new pair is counted as well."""
    ep.changes += 1
    key = cond.effect_key
    assert key is not None
    bits = ep.keys.get(key)
    if bits is None:
        ep.keys_over += 1
        return
    was = bool(bits & (_FAILOVER << _CONFIRMED_SHIFT))
    if was and not confirmed:
        bits &= ~(_FAILOVER << _CONFIRMED_SHIFT)
        ep.unconfirmed += 1
    elif confirmed and not was:
        bits |= _FAILOVER << _CONFIRMED_SHIFT
        ep.unconfirmed -= 1
    ep.keys[key] = bits
    points: list[Point] = []
    for occurrence in occurrences:
        point = (occurrence.seq, occurrence.pos, occurrence.event_id)
        if verified is None or not any_after(verified, *point):
            _pend(ep, points, point)
    if points:
        ep.dup_pending[key] = points
    else:
        ep.dup_pending.pop(key, None)
    slot = (cond.kind.value, key, cond.cause)
    if slot in ep.listed:
        ep.listed[slot] = cond  # the pair's own witness, whatever the former one was
    else:
        _list(ep, cond)


def verify(ep: Episode, key: str, verified: Marks) -> bool:
    """A verifier confirmed `key`: drop the occurrences it comes after. Did any go?"""
    return _verify(ep.pending, key, verified) | _verify(ep.dup_pending, key, verified)


def _verify(pending: dict[str, list[Point]], key: str, verified: Marks) -> bool:
    points = pending.get(key)
    if not points:
        return False
    left = [p for p in points if not any_after(verified, *p)]
    if len(left) == len(points):
        return False
    if left:
        pending[key] = left
    else:
        del pending[key]
    return True


def _pend(ep: Episode, points: list[Point], p: Point) -> None:
    """Add an unverified occurrence to its key's frontier: the points no other one dominates
    (verifying it would verify them). Those with `seq` are kept sorted by seq (ties by event id,
    as the order breaks them), their positions then falling, and one without seq last: an
    insertion is a bisection, and the frontier is exact. Past `_FRONTIER` points, which takes
    thousands of events arriving out of order, they are merged into one no earlier than any:
    harder to verify, never easier, and the finding says its evidence was cut."""
    seq, pos, eid = p
    n = len(points)
    m = n - 1 if n and points[-1][0] is None else n  # points[:m] have a seq
    if seq is None:
        if m == n:
            points.append(p)
        elif points[-1][1] < pos:
            points[-1] = p
        return
    at = (seq, eid)
    i = bisect_left(points, at, hi=m, key=_AT)
    if i < m and points[i][1] >= pos:
        return  # points[i]: as late by seq, and the highest position of those
    end = i + 1 if i < m and _AT(points[i]) == at else i
    start = i
    while start > 0 and points[start - 1][1] <= pos:
        start -= 1
    points[start:end] = [p]
    m += 1 - (end - start)
    if m > _FRONTIER:
        last = points[m - 1]
        points[:m] = [(last[0], points[0][1], last[2])]
        ep.truncated = True


def _show(shown: list[str], key: str) -> None:
    if len(shown) < SHOWN_KEYS or key < shown[-1]:
        shown.append(key)
        shown.sort()
        del shown[SHOWN_KEYS:]


def _list(ep: Episode, cond: ConditionRecord) -> None:
    """Keep the earliest witness of each condition among the candidates for listing: the
    `KEPT` earliest conditions and the earliest of each kind (`shown` lists the `LISTED` first).
    What falls out cannot come back (conditions only accumulate and witnesses only get earlier;
    an earlier witness comes back through here), so the list is the same whatever the arrival
    order. The one exception, a failover duplicate whose witness moves later when an epoch
    between its two arrives late, takes its place among the next ones: exact unless that happens
    to more than `KEPT - LISTED` of one finding's listed duplicates."""
    k = (cond.kind.value, cond.effect_key, cond.cause)
    listed = ep.listed
    old = listed.get(k)
    if old is not None:
        # At one place the newer wins: a duplicate's commits only get earlier, so the latest
        # one made names the owners of its earliest commits.
        best = old if _better(old, cond) else cond
        if _DESTINATION in (cond.source, old.source) and best.source != _DESTINATION:
            best = best._replace(source=_DESTINATION)
        if best != old:
            listed[k] = best
        return
    listed[k] = cond
    if len(listed) <= KEPT:
        return
    ranked = sorted(listed.items(), key=lambda item: _by_witness(item[1]))
    keep = {key for key, _ in ranked[:KEPT]}
    kinds: set[tuple[str, str | None]] = set()
    for key, c in ranked:
        if (c.kind.value, c.cause) not in kinds:
            kinds.add((c.kind.value, c.cause))
            keep.add(key)
    for key, _ in ranked:
        if key not in keep:
            del listed[key]


def shown(ep: Episode) -> list[ConditionRecord]:
    """The conditions a revision lists: the earliest of each kind, then the earliest others."""
    ranked = sorted(ep.listed.values(), key=_by_witness)
    kinds: dict[tuple[str, str | None], ConditionRecord] = {}
    for c in ranked:
        kinds.setdefault((c.kind.value, c.cause), c)
    room = LISTED - len(kinds)
    firsts = {id(c) for c in kinds.values()}
    others = [c for c in ranked if id(c) not in firsts][: max(room, 0)]
    return [*kinds.values(), *others]


def _compare(a: ConditionRecord, b: ConditionRecord) -> int:
    return -1 if _better(a, b) else 1 if _better(b, a) else 0


_by_witness: Final = cmp_to_key(_compare)
