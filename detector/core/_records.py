"""Compact records of retained evidence, and the one pairwise order every rule compares by.

Records are tuples, because a tracked workflow must stay small. Order (DESIGN §4): by `seq` when
both sides carry one, else by arrival (`pos`, the position within the workflow). That pairwise
rule is not transitive across mixed histories, so "the latest of a set" is kept as `Marks`: the
three extremes that answer "is any member after this point?" exactly for either kind of point.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from operator import itemgetter
from typing import Final, NamedTuple, TypeVar

from detector.contracts.findings import ConditionKind


class EventRecord(NamedTuple):
    """An observed event, reduced to what the rules read.

    `kind` and `source` hold the enums' plain string values: a tuple of only strings, numbers
    and None is dropped by the cyclic garbage collector, which matters at millions of them.
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


class AcquisitionRecord(NamedTuple):
    """An acquisition: the moment an epoch became authoritative."""

    epoch: int
    seq: int | None
    pos: int
    event_id: str
    worker_id: str
    obs: float | None


class ConditionRecord(NamedTuple):
    """A condition of an episode, with the event that witnesses it.

    `workers` names the owners of a duplicate's own commits (in the order of `epochs`).
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


Ordered = EventRecord | AcquisitionRecord | ConditionRecord
OrderedT = TypeVar("OrderedT", EventRecord, AcquisitionRecord, ConditionRecord)


def before(a: Ordered, b: Ordered) -> bool:
    """Did `a` happen before `b`? By `seq` when both carry one, else by arrival (also for two
    events at one `seq`, which an authoritative order should not have)."""
    if a.seq is not None and b.seq is not None and a.seq != b.seq:
        return a.seq < b.seq
    return a.pos < b.pos


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


# ---- Marks: [highest seq, highest pos of a member without seq, highest pos] -----------------

NONE: Final = -1  # no member of that class; seq and pos are never negative
Marks = list[int]


def marks() -> Marks:
    return [NONE, NONE, NONE]


def mark(m: Marks, seq: int | None, pos: int) -> bool:
    """Add a point; say whether any extreme moved."""
    moved = False
    if seq is not None:
        if seq > m[0]:
            m[0] = seq
            moved = True
    elif pos > m[1]:
        m[1] = pos
        moved = True
    if pos > m[2]:
        m[2] = pos
        moved = True
    return moved


def any_after(m: Marks, seq: int | None, pos: int) -> bool:
    """Is some member strictly after the point (seq, pos)?"""
    if seq is not None:
        return m[0] > seq or m[1] > pos
    return m[2] > pos


def any_at_or_after(m: Marks, seq: int | None, pos: int) -> bool:
    """Is some member the point itself or after it (not before it)?"""
    if seq is not None:
        return m[0] >= seq or m[1] >= pos
    return m[2] >= pos
