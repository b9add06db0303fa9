"""Compact records of retained evidence, and the one pairwise order every rule compares by.

Records are tuples, because a tracked workflow must stay small. Order (DESIGN §4): by `seq` when
both sides carry one (two events at one `seq`: an acquisition first, then by `event_id`), else by
arrival (`pos`, the position within the workflow). That pairwise rule is not transitive across
mixed histories, so a set is kept by its extremes: `Marks` (points only) and `Latest` (records),
which answer "is any member after this point?" exactly for either kind of point.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from operator import itemgetter
from sys import intern
from typing import Any, Final, NamedTuple, TypeVar

from detector.contracts.events import Kind, Source
from detector.contracts.findings import ConditionKind

from ._context import Context, context_row


class EventRecord(NamedTuple):
    """An observed event, reduced to what the rules read.

    `kind` and `source` hold the enums' plain string values: a tuple of only strings, numbers
    and None is dropped by the cyclic garbage collector, which matters at millions of them.
    `ctx` is the event's `attrs` and `detail` as a finding's `context` shows them (`_context`):
    one shared tuple, or None, kept only for kinds that can be a finding's latest condition.
    """

    event_id: str
    kind: str
    epoch: int
    seq: int | None
    pos: int
    source: str
    effect_key: str | None
    worker_id: str
    obs: float | None
    trace: str | None = None
    ctx: Context | None = None


class AcquisitionRecord(NamedTuple):
    """An acquisition: the moment an epoch became authoritative. `ctx`: as `EventRecord`'s."""

    epoch: int
    seq: int | None
    pos: int
    event_id: str
    worker_id: str
    obs: float | None
    ctx: Context | None = None


class ConditionRecord(NamedTuple):
    """A condition of an episode, with the event that witnesses it.

    `workers` names the owners of a duplicate's own commits (in the order of `epochs`);
    `by_seq` says of a retry's duplicate that both its commits carry `seq` (its ordering).
    """

    kind: ConditionKind
    event_id: str
    seq: int | None
    pos: int
    effect_key: str | None
    cause: str | None
    epochs: tuple[int, ...] | None
    source: str
    trace: str | None = None
    workers: tuple[str, ...] | None = None
    by_seq: bool = False


Ordered = EventRecord | AcquisitionRecord | ConditionRecord
# NamedTuple's generated __new__ runs Python code; building from a tuple is twice as fast
# (`new_record(EventRecord, values) == EventRecord(*values)`, pinned by a test).
new_record: Final = tuple.__new__
_ACQUIRED: Final = Kind.LEASE_ACQUIRED.value
# Acquisitions do not keep their source: the coordinator's (DESIGN §3).
_COORDINATOR: Final = Source.COORDINATOR.value


def raw_acquisition(a: AcquisitionRecord) -> EventRecord:
    """An acquisition as a raw event: after a takeover of its epoch, it is a sign of its
    owner's life like any other event of the owner's (DESIGN §4 "Time and silence")."""
    return EventRecord(
        a.event_id, _ACQUIRED, a.epoch, a.seq, a.pos, _COORDINATOR, None, a.worker_id, a.obs
    )


OrderedT = TypeVar("OrderedT", EventRecord, AcquisitionRecord, ConditionRecord)


def before(a: Ordered, b: Ordered) -> bool:
    """Did `a` happen before `b`? By `seq` when both carry one, else by arrival. Two events at
    one `seq`: an acquisition first, then by `event_id` (arrival never decides between them)."""
    sa = a.seq
    sb = b.seq
    if sa is None or sb is None:
        return a.pos < b.pos
    if sa != sb:
        return sa < sb
    return tie(a) < tie(b)


def tie(r: Ordered) -> tuple[bool, str]:
    """Where a record stands among the events at its `seq`: acquisitions first (one kept as a
    raw event too, `raw_acquisition`), then by id."""
    return (not isinstance(r, AcquisitionRecord) and r.kind != _ACQUIRED, r.event_id)


def earlier(a: OrderedT, b: OrderedT) -> OrderedT:
    """The earlier of two; `a` when neither is before the other (the same event)."""
    return b if before(b, a) else a


def later(a: OrderedT, b: OrderedT) -> OrderedT:
    """The later of two; `a` when neither is after the other (the same event)."""
    return b if before(a, b) else a


def earliest(items: Iterable[OrderedT]) -> OrderedT | None:
    """The earliest by the pairwise rule, keeping the first of any that compare equal."""
    found: OrderedT | None = None
    for item in items:
        found = item if found is None else earlier(found, item)
    return found


def in_order(items: list[OrderedT], rank: Callable[[OrderedT], int]) -> list[OrderedT]:
    """A few records (a finding's listed conditions) in the pairwise order: each one no other
    left is before; where that order makes a cycle, the cycle's earliest by `seq` (DESIGN §4).
    `rank` orders records at one place (one event witnessing two conditions). Quadratic: it is
    for the bounded lists a revision shows, never for a history."""
    n = len(items)
    after: list[list[int]] = [[] for _ in range(n)]
    preceded = [0] * n
    for i in range(n):
        for j in range(i + 1, n):
            if before(items[i], items[j]):
                after[i].append(j)
                preceded[j] += 1
            elif before(items[j], items[i]):
                after[j].append(i)
                preceded[i] += 1
    left = set(range(n))
    out: list[OrderedT] = []
    while left:
        free = [i for i in left if not preceded[i]]
        if free:
            pick = min(free, key=lambda i: rank(items[i]))
        else:  # a cycle: every one left follows another
            pick = min(
                (i for i in left if items[i].seq is not None),
                key=lambda i: (items[i].seq, tie(items[i]), rank(items[i])),
            )
        left.discard(pick)
        out.append(items[pick])
        for j in after[pick]:
            preceded[j] -= 1
    return out


# ---- identity -------------------------------------------------------------------------------


def fingerprint(kind: str, epoch: int, seq: int | None, worker: str, key: str | None) -> int:
    """Content of an event as far as an id conflict goes; stable across processes."""
    return zlib.crc32(f"{kind}\x1f{epoch}\x1f{seq}\x1f{worker}\x1f{key}".encode())


# A record's `event_id` by position: a NamedTuple's attribute is a Python-level property.
EVENT_ID: Final = itemgetter(EventRecord._fields.index("event_id"))
ACQ_ID: Final = itemgetter(AcquisitionRecord._fields.index("event_id"))
ACQ_EPOCH: Final = itemgetter(AcquisitionRecord._fields.index("epoch"))
# In an ids index: the content of this id is its retained record's, whose fingerprint is taken
# when the record is forgotten (most never are), not for every event.
RETAINED: Final = -1


def ev_print(e: EventRecord) -> int:
    return fingerprint(e.kind, e.epoch, e.seq, e.worker_id, e.effect_key)


def acq_print(a: AcquisitionRecord) -> int:
    return fingerprint("lease_acquired", a.epoch, a.seq, a.worker_id, None)


# ---- Marks: [highest seq, highest pos of a member without seq, highest pos, the highest id at
# the highest seq] --------------------------------------------------------------------------

NONE: Final = -1  # no member of that class; seq and pos are never negative
Marks = list[Any]
# The id of a point that is an acquisition (first at its seq, below every event id, which is
# never empty), and of a point from a state written before ties were ordered (a pending
# occurrence then counts as the last at its seq: harder to verify).
ACQUISITION: Final = ""
LAST_ID: Final = "\U0010ffff"


def marks() -> Marks:
    return [NONE, NONE, NONE, ACQUISITION]


def mark(m: Marks, seq: int | None, pos: int, eid: str) -> bool:
    """Add a point; say whether any extreme moved."""
    moved = False
    if seq is not None:
        if seq > m[0] or (seq == m[0] and eid > m[3]):
            m[0] = seq
            m[3] = eid
            moved = True
    elif pos > m[1]:
        m[1] = pos
        moved = True
    if pos > m[2]:
        m[2] = pos
        moved = True
    return moved


def any_after(m: Marks, seq: int | None, pos: int, eid: str) -> bool:
    """Is some member (never an acquisition) strictly after the point (seq, pos) with id `eid`
    (`ACQUISITION` for an acquisition)?"""
    if seq is not None:
        return bool(m[0] > seq or (m[0] == seq and m[3] > eid) or m[1] > pos)
    return bool(m[2] > pos)


def marks_of(row: list[Any]) -> Marks:
    """Marks as a state holds them (written before ties were ordered: without the id)."""
    return [*row, ACQUISITION] if len(row) == 3 else list(row)


# ---- Latest: a set of events by its extremes ---------------------------------------------------


class Latest(NamedTuple):
    """A set of events, for "which is the last?" and "is any after this point?".

    `top` is the member with seq that is last by seq, `unseq` the highest arrival of a member
    without seq, `last` the member that arrived last. The last event of the set is the one no
    other follows: `last` when it has no seq, else `top` when nothing without seq arrived after
    it. There is at most one such; with none (a cycle of the pairwise rule), it is `top`, the
    last by seq (never an event a seq shows to be earlier than another, when arrival decides
    nothing between them).
    """

    top: EventRecord | None
    unseq: int
    last: EventRecord

    @property
    def latest(self) -> EventRecord:
        top = self.top
        return self.last if top is None or self.last.seq is None else top


def extend(s: Latest | None, e: EventRecord) -> Latest:
    """The set with `e` in it (the same object when nothing changed)."""
    if s is None:
        return Latest(e, NONE, e) if e.seq is not None else Latest(None, e.pos, e)
    top, unseq, last = s
    changed = False
    if e.seq is not None:
        if top is None or before(top, e):
            top = e
            changed = True
    elif e.pos > unseq:
        unseq = e.pos
        changed = True
    if e.pos > last.pos:
        last = e
        changed = True
    return Latest(top, unseq, last) if changed else s


def union(a: Latest | None, b: Latest | None) -> Latest | None:
    if a is None or b is None:
        return a if b is None else b
    out = extend(a, b.last)
    if b.top is not None:
        out = extend(out, b.top)
    return out if b.unseq <= out.unseq else out._replace(unseq=b.unseq)


def after(s: Latest, r: Ordered) -> bool:
    """Is some member of the set after `r`?"""
    if r.seq is None:
        return s.last.pos > r.pos
    top = s.top
    return s.unseq > r.pos or (top is not None and before(r, top))


def latest_of(row: list[Any]) -> Latest:
    """A set as a state holds it; written before sets were kept: its one latest record."""
    if len(row) == 3:
        top, unseq, last = row
        return Latest(None if top is None else event_of(top), unseq, event_of(last))
    return extend(None, event_of(row))


def event_of(row: list[Any]) -> EventRecord:
    """A record from its row, its kind, source and worker one shared string each, as the engine
    holds them (a restored state is otherwise larger than the one it was written from)."""
    eid, kind, epoch, seq, pos, source, key, worker, *rest = row
    if len(rest) > 2:  # version 7 on: its context, one shared tuple again
        rest[2] = context_row(rest[2])
    return EventRecord(
        eid, intern(kind), epoch, seq, pos, intern(source), key, intern(worker), *rest
    )
