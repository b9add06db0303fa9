"""Garbage-collector thresholds for a process that holds detection state.

The engine allocates a few small tuples per event and keeps millions of them. With CPython's
default first-generation threshold (700 container allocations) a collection runs every few
hundred events and walks the survivors again and again. The engine makes no reference cycles, so
rarer collections cost no memory; `bench/bench_engine.py` measures the difference.
"""

from __future__ import annotations

import gc
from typing import Final

THRESHOLDS: Final = (50_000, 20, 20)


def tune() -> tuple[int, int, int]:
    """Apply `THRESHOLDS` to this process; return them (the benchmark prints what it ran with)."""
    gc.set_threshold(*THRESHOLDS)
    return THRESHOLDS
