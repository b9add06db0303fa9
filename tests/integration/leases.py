"""What the lease store's tests share: reading a job's outbox, and waiting for a lease to lapse on
the database's clock (the client's clock decides nothing)."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow

from detector.contracts.events import parse_event_obj
from detector.leases import JobClass, Lease


def job_class(name: str = "ocr", **policy: float) -> JobClass:
    """A job class with a one-second lease (L=1 > H + R x max(H, T) + J = 0.2 + 2 x 0.2 + 0.3),
    so that a lapse takes a second; `policy` overrides any of its numbers."""
    numbers: dict[str, float] = {
        "lease_s": 1.0,
        "heartbeat_s": 0.2,
        "missed_heartbeats": 2,
        "reserve_s": 0.3,
        # PostgreSQL runs on loopback: one that stopped refuses at once, well within a period.
        # (The partition test's black hole does hang an extension, and the lease is lost, as it
        # means to be.)
        "extend_timeout_s": 0.1,
        "max_attempts": 3,
        "tool_timeout_s": 5,
        "stage_time_limit_s": 60,
        "retry_backoff_s": 0,  # a retry is claimable at once, unless a test says otherwise
    }
    return JobClass.model_validate({"name": name, **numbers, **policy})


def count(db: psycopg.Connection[DictRow], query: str) -> int:
    """The `n` of a `SELECT count(*) AS n ...` query."""
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row["n"])


def claimed(lease: Lease | None) -> Lease:
    assert lease is not None
    return lease


def wait_lapsed(db: psycopg.Connection[DictRow], job: Lease | UUID, timeout: float = 30.0) -> None:
    """Until the job's lease has lapsed on the database's clock."""
    job_id = job.job_id if isinstance(job, Lease) else job
    deadline = time.monotonic() + timeout
    while True:
        row = db.execute(
            "SELECT lease_until <= now() AS lapsed FROM tool_jobs WHERE id = %s", (job_id,)
        ).fetchone()
        assert row is not None, f"no job {job_id}"
        if row["lapsed"]:
            return
        assert time.monotonic() < deadline, "the lease never lapsed on the database's clock"
        time.sleep(0.02)


def outbox(db: psycopg.Connection[DictRow], job_id: UUID) -> list[dict[str, Any]]:
    """The job's outbox events in seq order (gapless from 1), each meeting the input contract."""
    rows = db.execute(
        "SELECT seq, event FROM tool_job_outbox WHERE job_id = %s ORDER BY seq", (job_id,)
    ).fetchall()
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    for row in rows:
        event = parse_event_obj(row["event"])
        assert event.dropped_fields == () and event.seq == row["seq"], event.dropped_fields
    return [r["event"] for r in rows]
