"""The lease store's upkeep when it runs alone (`splitbrain leases maintain`): retention and the
live gauges, with no Kafka in the environment.

A team adopts the store as a job queue first and adds the detector later. Until then nobody
relays the outbox, and the relay is also what pruned and what served the gauges. This loop does
both on the store's own connection: the outbox and the finished jobs are pruned by age alone
(`relayed_only=False`) unless a relay runs beside it, and the gauges are served on /metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from detector.leases.errors import StoreUnavailableError
from detector.leases.gauges import LeaseGauges
from detector.leases.store import LeaseStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Upkeep:
    """What the loop keeps, and how often it looks."""

    job_retention: timedelta
    outbox_retention: timedelta
    relayed_only: bool  # True: a relay runs too, and only what it published is pruned
    prune_every_s: float = 60.0
    gauges_every_s: float = 5.0
    retry_s: float = 1.0


def maintain(store: LeaseStore, upkeep: Upkeep, gauges: LeaseGauges, stop: threading.Event) -> None:
    """Prune and read the gauges on their schedules until `stop` is set; a database that does
    not answer pauses both (the gauges keep their last values, and their age shows it)."""
    pruned_at = read_at = -float("inf")
    failing = False
    while not stop.is_set():
        try:
            if time.monotonic() - read_at >= upkeep.gauges_every_s:
                store.read_gauges(gauges)
                read_at = time.monotonic()
            if time.monotonic() - pruned_at >= upkeep.prune_every_s:
                store.prune(
                    upkeep.job_retention,
                    relayed_only=upkeep.relayed_only,
                    outbox_older_than=upkeep.outbox_retention,
                )
                pruned_at = time.monotonic()
        except StoreUnavailableError as exc:
            if not failing:
                log.warning("upkeep paused: %s", exc)
            failing = True
            stop.wait(upkeep.retry_s)
            continue
        if failing:
            log.info("upkeep resumed")
            failing = False
        due = min(pruned_at + upkeep.prune_every_s, read_at + upkeep.gauges_every_s)
        stop.wait(max(due - time.monotonic(), 0.0))
