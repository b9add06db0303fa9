"""What the lease store keeps, and for how long: finished jobs and relayed outbox rows are deleted
once older than a horizon (`splitbrain leases prune`, `splitbrain leases maintain`, and the relay
on its schedule).

Without it every heartbeat's outbox row, and every finished job, stays for ever. A job is deleted
only once finished (succeeded, failed, cancelled) and all its events are relayed, with its outbox
rows and the fenced destination's receipts for it: after that, its idempotency key enqueues a new
job and a destination's repeat of a pruned receipt is decided again. The horizon is therefore
also the idempotency window; keep it longer than any retry or late delivery.

A store run without the relay (no Kafka yet: a job queue alone) has nobody to relay its outbox:
`relayed_only=False` prunes its rows and its jobs by age alone, so the outbox holds the recent
past for `leases inspect` instead of growing by a row per heartbeat for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Final

import psycopg
from psycopg.rows import DictRow

DEFAULT_JOB_RETENTION: Final = timedelta(days=7)
DEFAULT_BATCH: Final = 1000

# Finished jobs last changed before the horizon, whose events are all relayed (unless the store
# runs without a relay).
_PRUNABLE: Final = """
SELECT id FROM tool_jobs AS j
 WHERE state IN ('succeeded', 'failed', 'cancelled') AND updated_at < now() - %(older_than)s
   AND (NOT %(relayed_only)s OR NOT EXISTS (SELECT 1 FROM tool_job_outbox AS o
                                             WHERE o.job_id = j.id AND o.relayed_at IS NULL))
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED
"""
_RECEIPTS: Final = "DELETE FROM fenced_receipts WHERE job_id = ANY(%s)"
_OUTBOX_OF: Final = "DELETE FROM tool_job_outbox WHERE job_id = ANY(%s)"
_JOBS: Final = "DELETE FROM tool_jobs WHERE id = ANY(%s)"
_RELAYED: Final = "DELETE FROM tool_job_outbox WHERE relayed_at < now() - %s"
_WRITTEN: Final = "DELETE FROM tool_job_outbox WHERE created_at < now() - %s"


@dataclass(frozen=True, slots=True)
class Pruned:
    """What pruning deleted."""

    jobs: int = 0
    outbox_rows: int = 0
    receipts: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(
            self.jobs + other.jobs,
            self.outbox_rows + other.outbox_rows,
            self.receipts + other.receipts,
        )


def prune_relayed(
    conn: psycopg.Connection[DictRow], older_than: timedelta, *, relayed_only: bool = True
) -> Pruned:
    """Delete the outbox rows relayed before `older_than` ago, of every job (with
    `relayed_only=False`, the rows written before it, relayed or not)."""
    statement = _RELAYED if relayed_only else _WRITTEN
    return Pruned(outbox_rows=max(conn.execute(statement, (older_than,)).rowcount, 0))


def prune_jobs(
    conn: psycopg.Connection[DictRow],
    older_than: timedelta,
    batch: int = DEFAULT_BATCH,
    *,
    relayed_only: bool = True,
) -> Pruned:
    """Delete up to `batch` finished jobs last changed before `older_than` ago, whose events are
    all relayed unless `relayed_only=False`, with their outbox rows and receipts, in the
    caller's transaction (jobs another pruner holds are skipped). Fewer than `batch` jobs
    deleted: none is left to prune."""
    params = {"older_than": older_than, "batch": batch, "relayed_only": relayed_only}
    ids = [r["id"] for r in conn.execute(_PRUNABLE, params).fetchall()]
    if not ids:
        return Pruned()
    receipts = conn.execute(_RECEIPTS, (ids,)).rowcount
    outbox_rows = conn.execute(_OUTBOX_OF, (ids,)).rowcount
    return Pruned(conn.execute(_JOBS, (ids,)).rowcount, outbox_rows, receipts)
