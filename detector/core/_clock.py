"""Silence on a history's own clocks (`audit`): which `observed_at` times to believe.

`audit` has no clock of its own, so a displaced owner's silence is measured on the workflow's
own times. One emitter's clock must not be able to declare everybody quiet: a time more than the
skew bound beyond the latest believed time is believed only once another emitter (a different
worker or source) of the same workflow reports a time within the bound of it. Belief is decided
over the whole history, then read in the workflow's order: with `seq` everywhere the verdict does
not depend on the order in which events arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ._records import EventRecord
from ._state import ClockEntry

_DOUBTED: Final = 64  # disbelieved times kept to be vouched for later; the rest stay counted


@dataclass(frozen=True, slots=True)
class Believed:
    """The latest believed time at each event of the order, and how many times were not."""

    index: dict[int, int]  # arrival position -> place in the order
    latest: list[float | None]
    disbelieved: int

    @property
    def now(self) -> float | None:
        return self.latest[-1] if self.latest else None

    def at(self, ev: EventRecord) -> float | None:
        """The latest believed time at or before `ev` in the order (None when it was cut)."""
        i = self.index.get(ev.pos)
        return None if i is None else self.latest[i]


def linear(clock: list[ClockEntry]) -> list[ClockEntry]:
    """One order consistent with the pairwise rule: arrival, with each run of events that carry
    `seq` between two that do not sorted by `seq` (and at one seq, acquisitions first, then by
    `event_id`: the entry's tie)."""
    entries = sorted(clock, key=lambda e: e[1])
    out: list[ClockEntry] = []
    run: list[ClockEntry] = []
    for e in entries:
        if e[0] is None:
            out.extend(sorted(run, key=lambda r: (r[0], r[5])))
            run = []
            out.append(e)
        else:
            run.append(e)
    out.extend(sorted(run, key=lambda r: (r[0], r[5])))
    return out


def believe(clock: list[ClockEntry], skew_s: float) -> Believed:
    order = linear(clock)
    flags = _flags(order, skew_s)
    latest: list[float | None] = []
    now: float | None = None
    for (_, _, t, *_), believed in zip(order, flags, strict=True):
        if believed and t is not None:
            now = t if now is None else max(now, t)
        latest.append(now)
    disbelieved = sum(1 for e, f in zip(order, flags, strict=True) if e[2] is not None and not f)
    return Believed({e[1]: i for i, e in enumerate(order)}, latest, disbelieved)


def _flags(order: list[ClockEntry], skew_s: float) -> list[bool]:
    """Which times are believed, in the end: vouching is retroactive, so a time believed late
    still stands at its own place in the order."""
    flags = [False] * len(order)
    top: float | None = None
    doubted: list[int] = []
    for i, (_, _, t, *_) in enumerate(order):
        if t is None:
            continue
        if top is not None and t > top + skew_s and not _vouched(order, doubted, i, skew_s):
            doubted.append(i)
            del doubted[:-_DOUBTED]
            continue
        # Believed; and a believed time vouches for doubted ones near it, which may vouch on.
        pending = [i]
        while pending:
            j = pending.pop()
            flags[j] = True
            tj = order[j][2]
            assert tj is not None
            top = tj if top is None else max(top, tj)
            near = [d for d in doubted if _agree(order[d], order[j], skew_s)]
            doubted = [d for d in doubted if d not in near]
            pending.extend(near)
    return flags


def _agree(a: ClockEntry, b: ClockEntry, skew_s: float) -> bool:
    """Two emitters, one time within the bound."""
    return (
        (a[3] != b[3] or a[4] != b[4])
        and a[2] is not None
        and b[2] is not None
        and abs(a[2] - b[2]) <= skew_s
    )


def _vouched(order: list[ClockEntry], doubted: list[int], i: int, skew_s: float) -> bool:
    return any(_agree(order[d], order[i], skew_s) for d in doubted)
