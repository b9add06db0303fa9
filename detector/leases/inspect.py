"""Who owns what in the lease store now: the ownership view behind `splitbrain leases inspect`.

Per job class: the counts of each state, the running leases that have expired (state `running`,
`lease_until <= now()`: the owner stopped extending and no worker has claimed the job again
yet), the age of the oldest queued job, and the running jobs themselves — owner, token, attempt,
lease remaining and heartbeat age — at most `limit` of them, expired ones first, then by least
lease remaining.

Every time is the database's: lease remaining and heartbeat age are computed in SQL from its
`now()`, as the store's leases are, never from this machine's clock. Both queries run in one
read-only REPEATABLE READ transaction, so the counts and the rows are one snapshot at one `now()`.
Only technical ids are read: never a payload, a result or an error.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Final
from uuid import UUID

import psycopg
from psycopg.rows import DictRow

from detector.leases.errors import LeaseError, MigrationError
from detector.leases.schema import MIGRATIONS

DEFAULT_LIMIT: Final = 50

_RECORDED: Final = (
    "SELECT to_regclass('splitbrain_migrations') IS NOT NULL AS recorded,"
    " to_regclass('tool_jobs') IS NOT NULL AS jobs"
)
_VERSION: Final = "SELECT max(version) AS version FROM splitbrain_migrations"
_CLASS: Final = "(%(job_class)s::text IS NULL OR job_class = %(job_class)s::text)"
_SUMMARY: Final = f"""
SELECT job_class,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'running' AND lease_until <= now()) AS expired,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'queued'))::float8
           AS oldest_queued_age_s
  FROM tool_jobs
 WHERE {_CLASS}
 GROUP BY job_class
 ORDER BY job_class
"""
# Ordered by lease_until: the expired leases come first (the longest expired first), then the
# running ones by least lease remaining; the id breaks ties so that the order is stable.
_RUNNING: Final = f"""
SELECT id AS job_id, job_class, owner_id, fencing_token, attempt, tool_class,
       extract(epoch FROM lease_until - now())::float8 AS lease_remaining_s,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s,
       lease_until <= now() AS expired
  FROM (SELECT id, job_class, owner_id, fencing_token, attempt, tool_class, lease_until,
               heartbeat_at,
               row_number() OVER (PARTITION BY job_class ORDER BY lease_until, id) AS rank
          FROM tool_jobs
         WHERE state = 'running' AND {_CLASS}) AS running
 WHERE rank <= %(limit)s
 ORDER BY job_class, lease_until, id
"""


class NotMigratedError(LeaseError):
    """The database has no lease store, or an older schema than this version reads."""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """One running job's lease, as the database saw it at the inspection's `now()`."""

    job_id: UUID
    owner_id: str
    fencing_token: int
    attempt: int
    lease_remaining_s: float  # negative once the lease expired
    heartbeat_age_s: float | None  # since the claim or the last extend
    expired: bool  # lease_until <= now(): the owner may no longer write
    tool_class: str | None


# the columns of _RUNNING a RunningJob holds, under its field names
_RUNNING_JOB: Final = tuple(f.name for f in fields(RunningJob))


@dataclass(frozen=True, slots=True)
class ClassView:
    """One job class: its counts, and its running jobs up to the limit."""

    job_class: str
    queued: int
    running: int
    expired: int  # running, with the lease expired
    succeeded: int
    failed: int
    oldest_queued_age_s: float | None  # since the oldest queued job was enqueued; None: none
    running_jobs: tuple[RunningJob, ...]  # expired first, then by least lease remaining

    @property
    def running_omitted(self) -> int:
        """Running jobs left out by the limit."""
        return self.running - len(self.running_jobs)


@dataclass(frozen=True, slots=True)
class Inspection:
    observed_at: datetime  # the database's now(), which every age and remaining time is from
    job_class: str | None  # the class asked for; None: every class with jobs
    limit: int
    classes: tuple[ClassView, ...]  # by name

    @property
    def expired(self) -> int:
        """Running leases expired, over every class inspected (not only the rows shown)."""
        return sum(c.expired for c in self.classes)


def inspect_leases(
    conn: psycopg.Connection[DictRow],
    *,
    job_class: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Inspection:
    """The lease store's ownership view: every class with jobs, or only `job_class` (reported,
    with zero counts, even when it has none). `NotMigratedError` if the database has no lease
    store or an older schema, `MigrationError` if a newer version migrated it."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    params = {"job_class": job_class, "limit": limit}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        _check_schema(conn)
        now = conn.execute("SELECT now() AS now").fetchone()
        summaries = conn.execute(_SUMMARY, params).fetchall()
        rows = conn.execute(_RUNNING, params).fetchall()
    assert now is not None
    running: dict[str, list[RunningJob]] = {}
    for row in rows:
        job = RunningJob(**{name: row[name] for name in _RUNNING_JOB})
        running.setdefault(row["job_class"], []).append(job)
    classes = [
        ClassView(**row, running_jobs=tuple(running.get(row["job_class"], ()))) for row in summaries
    ]
    if job_class is not None and not classes:
        classes.append(ClassView(job_class, 0, 0, 0, 0, 0, None, ()))
    return Inspection(
        observed_at=now["now"], job_class=job_class, limit=limit, classes=tuple(classes)
    )


def _check_schema(conn: psycopg.Connection[DictRow]) -> None:
    latest = max(m.version for m in MIGRATIONS)
    found = conn.execute(_RECORDED).fetchone()
    assert found is not None
    if not (found["recorded"] and found["jobs"]):
        raise NotMigratedError(
            "the database has no lease store (no tool_jobs table): run `splitbrain leases "
            "migrate` with the same DSN first"
        )
    row = conn.execute(_VERSION).fetchone()
    version = None if row is None else row["version"]
    if version is None or version < latest:
        raise NotMigratedError(
            f"the lease store's schema is at version {version or 0}, this version reads "
            f"{latest}: run `splitbrain leases migrate` with the same DSN first"
        )
    if version > latest:
        raise MigrationError(
            f"the lease store's schema is at version {version}, which this version does not "
            f"know (it knows up to {latest}): a newer splitbrain migrated it"
        )
