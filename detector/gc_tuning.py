"""Garbage-collector settings for a process that holds detection state.

The engine allocates a few small tuples per event and keeps millions of them. With CPython's
default first-generation threshold (700 container allocations) a collection runs every few
hundred events and walks the survivors again and again. The engine makes no reference cycles, so
rarer collections cost no memory; `bench/bench_engine.py` measures the difference.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Final

THRESHOLDS: Final = (50_000, 20, 20)
FREEZE_EVERY_S: Final = 5.0  # a worker's `Freezer`: as often as it lets time pass


def tune() -> tuple[int, int, int]:
    """Apply `THRESHOLDS` to this process; return them (the benchmark prints what it ran with)."""
    gc.set_threshold(*THRESHOLDS)
    return THRESHOLDS


@dataclass(slots=True)
class Freezer:
    """Moves every object alive into the collector's permanent generation (`gc.freeze`), at most
    every `every_s` seconds, so that no later collection walks it again.

    Under `THRESHOLDS` a second-generation collection walks what survived twenty first-generation
    ones: in a worker filling up to 40,000 workflows, about a million objects, a 611 ms pause
    that held back every finding in flight (docs/benchmarks.md, "The collector's pause").
    Frozen, the states are walked by none; a collection walks at most what survived since the
    last freeze. A frozen object is still freed when its last reference goes; a frozen reference
    cycle never is. `gc.freeze` takes garbage not collected yet as well, so the youngest
    generation is collected first (~6 ms: it holds at most `THRESHOLDS[0]` allocations; the
    worker's cycles die young); a cycle alive at the freeze that dies later would stay, and the
    processing step makes none (`tests/unit/test_gc_tuning.py`).
    """

    every_s: float = FREEZE_EVERY_S
    _last: float | None = None

    def __call__(self, now: float) -> bool:
        """Freeze if `every_s` has passed since the last time, on the caller's monotonic `now`;
        whether it did (`gc.freeze` itself only relinks two lists)."""
        if self._last is not None and now - self._last < self.every_s:
            return False
        self._last = now
        gc.collect(0)
        gc.freeze()
        return True
