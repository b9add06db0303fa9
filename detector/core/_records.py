"""Compact records of retained evidence: tuples, because a tracked workflow must stay small."""

from __future__ import annotations

from typing import NamedTuple

from detector.findings import ConditionKind


class Ev(NamedTuple):
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


class Acq(NamedTuple):
    """An acquisition: the moment an epoch became authoritative."""

    epoch: int
    seq: int | None
    pos: int
    event_id: str
    worker_id: str
    obs: float | None


class Cond(NamedTuple):
    """A condition of an episode, with the event that witnesses it."""

    kind: ConditionKind
    event_id: str
    seq: int | None
    pos: int
    effect_key: str | None
    cause: str | None
    epochs: tuple[int, ...] | None
    source: str
    trace: str | None = None


Ordered = Ev | Acq | Cond


def order_key(item: Ordered) -> tuple[int, int, str]:
    """A total order: authoritative `seq` first, arrival for events without one; ids break ties."""
    if item.seq is not None:
        return (0, item.seq, item.event_id)
    return (1, item.pos, item.event_id)


def before(a: Ordered, b: Ordered) -> bool:
    """Did `a` happen before `b`? By `seq` when both carry one, else by arrival."""
    if a.seq is not None and b.seq is not None:
        return a.seq < b.seq
    return a.pos < b.pos
