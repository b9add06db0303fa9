"""Exponential backoff with "equal jitter", the one rule for every retry the product schedules:
the pager bridge's deliveries (`detector.paging.delivery.Backoff`) and the lease store's
requeued jobs (`detector.leases.policy.JobClass.retry_delay_s`).

Our own, not tenacity's or backoff's: they run the retry loop themselves, with full or additive
jitter from the global `random`; both callers only compute a due time from a draw they own.
"""

from __future__ import annotations

import sys
from typing import Final

# Doubling stops here: `2.0 ** 1024` overflows, and by then any ceiling is the maximum.
_MAX_DOUBLINGS: Final = sys.float_info.max_exp - 1


def equal_jitter(attempt: int, initial: float, maximum: float, draw: float) -> float:
    """The wait after the `attempt`-th failure (1: the first) for a uniform `draw` in [0, 1):
    the ceiling `initial * 2^(attempt-1)`, at most `maximum`, half fixed and half drawn, so that
    waits grow while retries that failed together (a sink or provider outage) do not all come
    back together."""
    ceiling = min(maximum, initial * 2.0 ** min(max(0, attempt - 1), _MAX_DOUBLINGS))
    return ceiling / 2 + ceiling / 2 * draw
