"""Silence on a history's own clocks (`audit`): which `observed_at` times to believe.

`audit` has no clock of its own, so a displaced owner's silence is measured on the workflow's
own times. One emitter's clock must not be able to declare everybody quiet: a time more than the
skew bound beyond the latest believed time is believed only once another emitter (a different
worker or source) of the same workflow reports a time within the bound of it. Belief is decided
over the whole history, then read in the workflow's order: with `seq` everywhere the verdict does
not depend on the order in which events arrived.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from math import inf
from typing import Final

from ._records import EventRecord
from ._state import ClockEntry

# Emitters whose disbelieved times wait to be vouched for, each in its own sorted list: a time
# is checked against each other emitter's list by bisection. Past this many at once, the
# earliest emitter's times are forgotten, and the findings that hinge on silence say so.
_DOUBTING: Final = 64
Emitter = tuple[str, str]  # worker, source


@dataclass(frozen=True, slots=True)
class Believed:
    """The latest believed time at each event of the order, and how many times were not."""

    index: dict[int, int]  # arrival position -> place in the order
    latest: list[float | None]
    disbelieved: int
    cut: bool = False  # some disbelieved times were forgotten before they could be vouched for

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
    flags, cut = _flags(order, skew_s)
    latest: list[float | None] = []
    now: float | None = None
    for (_, _, t, *_), believed in zip(order, flags, strict=True):
        if believed and t is not None:
            now = t if now is None else max(now, t)
        latest.append(now)
    disbelieved = sum(1 for e, f in zip(order, flags, strict=True) if e[2] is not None and not f)
    return Believed({e[1]: i for i, e in enumerate(order)}, latest, disbelieved, cut)


def _flags(order: list[ClockEntry], skew_s: float) -> tuple[list[bool], bool]:
    """Which times are believed, in the end (vouching is retroactive, so a time believed late
    still stands at its own place in the order); and whether waiting times were forgotten.
    Each time is looked up once per emitter that has times waiting, by bisection."""
    flags = [False] * len(order)
    top: float | None = None
    doubted: dict[Emitter, list[tuple[float, int]]] = {}  # emitter -> (time, place), sorted
    cut = False
    for i, (_, _, t, worker, source, *_) in enumerate(order):
        if t is None:
            continue
        if top is not None and t > top + skew_s and not _near(doubted, (worker, source), t, skew_s):
            waiting = doubted.get((worker, source))
            if waiting is None:
                if len(doubted) >= _DOUBTING:
                    del doubted[next(iter(doubted))]
                    cut = True
                waiting = doubted[(worker, source)] = []
            insort(waiting, (t, i))
            continue
        # Believed; and a believed time vouches for doubted ones near it, which may vouch on.
        pending = [i]
        while pending:
            j = pending.pop()
            flags[j] = True
            tj, wj, sj = order[j][2:5]
            assert tj is not None
            top = tj if top is None else max(top, tj)
            pending.extend(_near(doubted, (wj, sj), tj, skew_s, take=True))
    return flags, cut


def _near(
    doubted: dict[Emitter, list[tuple[float, int]]],
    emitter: Emitter,
    t: float,
    skew_s: float,
    take: bool = False,
) -> list[int]:
    """The places of other emitters' doubted times within the bound of `t`: all of them, taken
    out of `doubted`, when `take`; else at most one (is `t` vouched for?)."""
    found: list[int] = []
    for other, times in list(doubted.items()):
        if other == emitter:
            continue
        lo = bisect_left(times, (t - skew_s, -1))
        hi = bisect_right(times, (t + skew_s, inf))
        if lo == hi:
            continue
        if not take:
            return [times[lo][1]]
        found.extend(place for _, place in times[lo:hi])
        del times[lo:hi]
        if not times:
            del doubted[other]
    return found
