"""Silence on a history's own clocks (`audit`): which `observed_at` times to believe.

`audit` has no clock of its own, so a displaced owner's silence is measured on the workflow's
own times. One emitter's clock must not be able to declare everybody quiet: a time more than the
skew bound beyond the latest believed time is believed only once another emitter of the same
workflow reports a time within the bound of it. Times are taken in the workflow's authoritative
order (seq; arrival without one), so with `seq` everywhere the verdict does not depend on the
order in which events arrived.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Final

from ._records import Ev
from ._state import ClockEntry

_DOUBTED: Final = 64


@dataclass(frozen=True, slots=True)
class Believed:
    """The latest believed time at each position of the order, and how many were not."""

    order: list[tuple[int, int]]
    latest: list[float | None]
    disbelieved: int

    @property
    def now(self) -> float | None:
        return self.latest[-1] if self.latest else None

    def at(self, ev: Ev) -> float | None:
        """The latest believed time at or before `ev` in the order."""
        i = bisect_right(self.order, (0, ev.seq) if ev.seq is not None else (1, ev.pos))
        return self.latest[i - 1] if i else None


def believe(clock: list[ClockEntry], skew_s: float) -> Believed:
    entries = sorted(clock, key=lambda e: (e[0], e[1]))
    latest: float | None = None
    doubted: list[tuple[float, str]] = []
    marks: list[float | None] = []
    disbelieved = 0
    for _, _, t, emitter in entries:
        if latest is None or t <= latest + skew_s:
            latest = t if latest is None else max(latest, t)
        else:
            witness = next(
                (d for d, who in doubted if who != emitter and abs(d - t) <= skew_s), None
            )
            if witness is None:
                doubted.append((t, emitter))
                del doubted[:-_DOUBTED]  # the most recent few can still be corroborated
                disbelieved += 1
            else:
                # Two emitters agree: both times stand.
                disbelieved -= 1
                doubted.remove(next(x for x in doubted if x[0] == witness and x[1] != emitter))
                latest = max(latest, t, witness)
        marks.append(latest)
    return Believed([(e[0], e[1]) for e in entries], marks, disbelieved)
