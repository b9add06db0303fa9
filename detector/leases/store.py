"""The fenced lease store: jobs in PostgreSQL, claimed under a lease and a fencing token.

Every decision about time is the database's, so no worker's clock can stretch a lease. A lease
starts at the transaction's `now()` (no later than the statement: never longer than asked). An
owner's write checks it against `clock_timestamp()`, the time the row is checked, not `now()`:
an extension whose BEGIN came before the lease ran out, and whose UPDATE came after it (or
waited for the row's lock past it), is refused. A claim takes an expired lease by `now()`, the
earlier time, which can only make the takeover later.

Every write an owner makes (extend, complete, fail) is conditional on its owner id, its token
and an unexpired lease, so a displaced owner cannot move the job, and is told so by an answer
(`LeaseLost`, `Outcome.REJECTED`) rather than an error.

Each transition, and each refusal, appends one ownership event to `tool_job_outbox` in its own
transaction, with the job's next `seq` taken there from the job row (which that transaction holds
locked). So the outbox has exactly the transitions that committed, in the order they committed:
anything a displaced owner does after a takeover is recorded after it, whatever the owner
believes, and an event recorded before it keeps its place however late it is relayed.

Synchronous psycopg: the heartbeat of a worker must keep going when the tool call blocks its
event loop, so it runs on a thread of its own, and a blocking connection per thread is the
simplest thing that does that. A store holds one connection: use one store per thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final
from uuid import UUID

import psycopg
from psycopg.rows import DictRow, dict_row

from detector.closing import Closing
from detector.contracts.events import MAX_KEY_CHARS, MAX_WORKER_ID_CHARS, Source
from detector.leases.db import SERVER_SETTINGS, Database
from detector.leases.errors import JobKeyConflictError, LeaseInputError
from detector.leases.gauges import LeaseGauges
from detector.leases.outbox import EventKind, append, event_columns, next_seq, row_labels
from detector.leases.policy import JobClass, Labels
from detector.leases.retention import DEFAULT_BATCH, Pruned, prune_jobs, prune_relayed
from detector.leases.values import MAX_PAYLOAD_BYTES, check_text, digest, json_text

log = logging.getLogger(__name__)
# Backoff jitter: spreads retries, nothing to do with secrets.
_jitter: Final = random.Random()

# The NOTIFY channel of enqueued jobs, its payload the job class (`detector.leases.wakeup`).
WAKEUP_CHANNEL: Final = "splitbrain_leases"
MAX_PRIORITY: Final = 9
# Where an enqueue is written: the store's connection, or a cursor on the application's own.
_Executes = psycopg.Connection[DictRow] | psycopg.Cursor[DictRow]

# The job table is where a job's result goes: refusing a stale owner's result is a destination
# enforcing the fence, which the detector counts as the fence holding.
RESULT_DESTINATION: Final = "tool_jobs"


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # an operator's stop: the running owner, if any, is fenced


FINISHED: Final = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class LostReason(StrEnum):
    """Why an owner's write found its lease gone (`heartbeat_lost`'s `detail.reason`)."""

    TAKEN_OVER = "taken_over"  # another owner claimed the job under a newer token
    CANCELLED = "cancelled"  # an operator cancelled the job (`splitbrain leases cancel`)
    FINISHED = "finished"  # the job already succeeded or failed
    EXPIRED = "expired"  # the lease ran out and nobody has claimed the job yet


class Outcome(StrEnum):
    """The answer to `complete` or `fail`."""

    SUCCEEDED = "succeeded"
    REQUEUED = "requeued"  # failed with attempts left: queued for another claim
    FAILED = "failed"  # failed for good; the job's `error` says why
    REJECTED = "rejected"  # not the owner, not its token, or its lease expired: nothing changed


class FailureReason(StrEnum):
    RETRYING = "retrying"
    NOT_RETRYABLE = "not_retryable"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed job, as its owner holds it: what every later write of the owner presents."""

    job_id: UUID
    job_class: str
    owner_id: str
    fencing_token: int
    attempt: int
    lease_until: datetime
    idempotency_key: str
    payload: Any
    labels: Labels


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """`extend` found the lease gone: expired, or taken by a newer token. Stop; commit nothing."""

    job_id: UUID
    fencing_token: int


@dataclass(frozen=True, slots=True)
class Job:
    id: UUID
    job_class: str
    state: JobState
    owner_id: str | None
    fencing_token: int
    attempt: int
    lease_until: datetime | None
    heartbeat_at: datetime | None
    idempotency_key: str
    payload: Any
    result: Any
    error: Any
    labels: Labels
    created_at: datetime
    updated_at: datetime
    not_before: datetime | None = None  # a retry, or a job given `run_at`, waits until then
    priority: int = 0


_JOB_COLUMNS: Final = (
    "id, job_class, state, owner_id, fencing_token, attempt, lease_until, heartbeat_at, "
    "idempotency_key, payload, result, error, tool_class, model, provider, created_at, updated_at,"
    " not_before, priority"
)


@dataclass(frozen=True, slots=True)
class Stage:
    """The next stage of a chain of persisted stages: the job enqueued in the transaction that
    completes the current one (`LeaseStore.complete(..., then=...)`)."""

    job_class: str
    idempotency_key: str
    payload: Any
    labels: Labels | None = None
    priority: int = 0
    run_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class _Refusal:
    """The event of an owner's write refused because its lease no longer holds; `refused` names
    the write (`detail.refused`), and a lease-lost event also says why (`detail.reason`)."""

    kind: EventKind
    source: Source
    refused: str
    destination: str | None = None


_EXTEND_REFUSED: Final = _Refusal("heartbeat_lost", Source.WORKER, "extend")
# A refused request start is its own event: `heartbeat_lost` (the owner learns it is displaced,
# and nothing was sent), told apart by `detail.refused` and carrying the request id.
_REQUEST_REFUSED: Final = _Refusal("heartbeat_lost", Source.WORKER, "request_start")
_RESULT_REJECTED: Final = _Refusal(
    "result_rejected", Source.DESTINATION, "result", RESULT_DESTINATION
)


# Claimable (a retry once its backoff is over), or about to be failed for good when its attempts
# are used up.
_AVAILABLE: Final = (
    "((state = 'queued' AND (not_before IS NULL OR not_before <= now()))"
    " OR (state = 'running' AND lease_until <= now()))"
)
# The owner's write is allowed only while its lease holds, at the moment the row is checked
# (again, if the statement waited for the row's lock).
_HELD: Final = (
    "id = %(job_id)s AND job_class = %(job_class)s AND owner_id = %(owner_id)s"
    " AND fencing_token = %(fencing_token)s AND state = 'running'"
    " AND lease_until > clock_timestamp()"
)
_FAILURE: Final = "%(error)s::jsonb || jsonb_build_object('attempt', attempt)"

_ENQUEUE: Final = f"""
INSERT INTO tool_jobs (job_class, idempotency_key, payload, tool_class, model, provider,
                       gauge_labels, priority, not_before)
VALUES (%(job_class)s, %(idempotency_key)s, %(payload)s::jsonb, %(tool_class)s, %(model)s,
        %(provider)s, %(gauge_labels)s::jsonb, %(priority)s, %(run_at)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING {_JOB_COLUMNS}, true AS created, true AS same
"""
# Wakes the runners waiting for the class (`detector.leases.wakeup`) when the job's transaction
# commits; a job scheduled for later is found by their poll instead.
_NOTIFY: Final = (
    "SELECT pg_notify(%(channel)s, %(job_class)s) WHERE %(run_at)s::timestamptz IS NULL"
)
# The key's job, and whether it is the same operation (class and payload) as the one asked for.
_JOB_BY_KEY: Final = f"""
SELECT {_JOB_COLUMNS}, false AS created,
       job_class = %(job_class)s AND payload = %(payload)s::jsonb AS same
  FROM tool_jobs WHERE idempotency_key = %(idempotency_key)s
"""
_JOB_BY_ID: Final = f"SELECT {_JOB_COLUMNS} FROM tool_jobs WHERE id = %s"
# The claim, in one statement. `spent`: the class's jobs whose last attempt ended without an
# answer (or whose class now allows fewer attempts) fail for good, since nobody may claim them
# again. Then a job whose lease expired (soonest expired first), or else the first claimable
# queued job (by priority, then age), is taken under the next token, skipping rows another
# claimer holds. Each candidate is read from its own partial index (`tool_jobs_leased`,
# `tool_jobs_queued`), so a claim does not pass over running jobs whose leases hold, and the
# second is read only when the first finds nothing, so at most one row is taken. The rows of
# both come back, `claimed` telling them apart.
_CLAIM: Final = f"""
WITH spent AS (
    UPDATE tool_jobs AS s
       SET state = 'failed', error = {_FAILURE}, event_seq = s.event_seq + 1, updated_at = now()
     WHERE s.id IN (SELECT id FROM tool_jobs
                     WHERE job_class = %(job_class)s AND attempt >= %(max_attempts)s
                       AND {_AVAILABLE}
                       FOR UPDATE SKIP LOCKED)
    RETURNING false AS claimed, NULL::text AS idempotency_key, NULL::jsonb AS payload,
              {event_columns("s.")}
), expired AS (
    SELECT id FROM tool_jobs
     WHERE job_class = %(job_class)s AND state = 'running' AND lease_until <= now()
       AND attempt < %(max_attempts)s
     ORDER BY lease_until
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), queued AS (
    SELECT id FROM tool_jobs
     WHERE job_class = %(job_class)s AND state = 'queued'
       AND (not_before IS NULL OR not_before <= now()) AND attempt < %(max_attempts)s
     ORDER BY priority, created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE tool_jobs AS j
       SET state = 'running',
           owner_id = %(owner_id)s,
           fencing_token = j.fencing_token + 1,
           attempt = j.attempt + 1,
           lease_until = now() + %(lease)s,
           heartbeat_at = now(),
           event_seq = j.event_seq + 1,
           updated_at = now()
      FROM (SELECT id FROM expired UNION ALL SELECT id FROM queued LIMIT 1) AS next
     WHERE j.id = next.id
    RETURNING true AS claimed, j.idempotency_key, j.payload, {event_columns("j.")}
)
SELECT * FROM spent UNION ALL SELECT * FROM taken
"""
_EXTEND: Final = f"""
UPDATE tool_jobs
   SET lease_until = now() + %(lease)s, heartbeat_at = now(), event_seq = event_seq + 1,
       updated_at = now()
 WHERE {_HELD}
RETURNING {event_columns()}
"""
# Starting a tool request changes nothing of the job; it is allowed only while the lease holds.
_REQUEST: Final = f"""
UPDATE tool_jobs SET event_seq = event_seq + 1, updated_at = now()
 WHERE {_HELD}
RETURNING {event_columns()}
"""
_COMPLETE: Final = f"""
UPDATE tool_jobs
   SET state = 'succeeded', result = %(result)s::jsonb, event_seq = event_seq + 1,
       updated_at = now()
 WHERE {_HELD}
RETURNING {event_columns()}
"""
_FAIL: Final = f"""
UPDATE tool_jobs
   SET state = %(state)s, error = {_FAILURE}, event_seq = event_seq + 1, updated_at = now(),
       not_before = now() + %(delay)s
 WHERE {_HELD}
RETURNING {event_columns()}
"""
# An operator's stop: the job takes the next token (held by the canceller, under no lease), so
# the running owner's writes are refused and a fenced destination refuses its fence; two events,
# the canceller's acquisition of that token and its release, make any later effect of the
# displaced owner stale to the detector.
_CANCEL: Final = f"""
UPDATE tool_jobs AS j
   SET state = 'cancelled', owner_id = %(by)s, fencing_token = j.fencing_token + 1,
       lease_until = NULL, not_before = NULL, event_seq = j.event_seq + 2, updated_at = now(),
       error = jsonb_build_object('reason', 'cancelled', 'by', %(by)s::text,
                                  'attempt', j.attempt)
  FROM (SELECT id, state FROM tool_jobs WHERE id = %(job_id)s FOR UPDATE) AS was
 WHERE j.id = was.id AND was.state IN ('queued', 'running')
RETURNING was.state AS was_state, {event_columns("j.")}
"""


def idle_in_transaction(classes: Iterable[JobClass]) -> dict[str, str]:
    """A session frozen inside a transaction holds its job's row lock: the server ends it
    within the shortest lease of the classes, not after its default minute (a 1 s lease would
    otherwise hold its job for 60 s)."""
    shortest_ms = min((int(c.lease_s * 1000) for c in classes), default=None)
    if shortest_ms is None:
        return {}
    held_ms = min(shortest_ms, int(SERVER_SETTINGS["idle_in_transaction_session_timeout"]))
    return {"idle_in_transaction_session_timeout": str(max(held_ms, 1))}


class LeaseStore(Closing):
    """Jobs of the given classes in the database at `dsn` (migrated by `splitbrain leases
    migrate`). A broken connection is replaced on the next call."""

    def __init__(
        self,
        dsn: str,
        classes: Iterable[JobClass],
        *,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        self._classes: dict[str, JobClass] = {}
        for job_class in classes:
            if job_class.name in self._classes:
                raise LeaseInputError("job_class", f"{job_class.name!r} is defined twice")
            self._classes[job_class.name] = job_class
        self._max_payload_bytes = max_payload_bytes
        self._db = Database(dsn, settings=idle_in_transaction(self._classes.values()))
        self._db.connection()  # a DSN or a database that cannot be used fails here

    def close(self) -> None:
        self._db.close()

    # -- the job's life ---------------------------------------------------------------------

    def enqueue(
        self,
        job_class: str,
        idempotency_key: str,
        payload: Any,
        labels: Labels | None = None,
        *,
        priority: int = 0,
        run_at: datetime | None = None,
        connection: psycopg.Connection[Any] | None = None,
    ) -> Job:
        """A new queued job, or the job this idempotency key already names (as it is now), if it
        is the same operation: `JobKeyConflictError` if that job has another class or payload.

        `priority` 0 (the default) is claimed first, 9 last; `run_at` is not claimed before
        then. With `connection`, the application's own, the job is written in that
        connection's transaction: it exists, and wakes the runners, only if that commits."""
        params = self._stage_params(
            Stage(job_class, idempotency_key, payload, labels, priority, run_at)
        )
        if connection is not None:
            return self._enqueue(connection.cursor(row_factory=dict_row), params)
        with self._db.transaction() as conn:
            return self._enqueue(conn, params)

    def _stage_params(self, stage: Stage) -> dict[str, Any]:
        policy = self.policy(stage.job_class)
        check_text("idempotency_key", stage.idempotency_key, MAX_KEY_CHARS)
        if not 0 <= stage.priority <= MAX_PRIORITY:
            raise LeaseInputError("priority", f"expected 0 (first) to {MAX_PRIORITY} (last)")
        if stage.run_at is not None and stage.run_at.utcoffset() is None:
            raise LeaseInputError("run_at", "expected a time with its UTC offset")
        labels = stage.labels or Labels()
        return {
            "job_class": stage.job_class,
            "idempotency_key": stage.idempotency_key,
            "payload": self._json("payload", stage.payload),
            **labels.model_dump(),
            "gauge_labels": json.dumps(policy.gauge_labels(labels)),
            "priority": stage.priority,
            "run_at": stage.run_at,
            "channel": WAKEUP_CHANNEL,
        }

    def _enqueue(self, conn: _Executes, params: dict[str, Any]) -> Job:
        row = None
        while row is None:
            row = conn.execute(_ENQUEUE, params).fetchone()
            if row is None:
                # The key's job committed before our insert, so this newer snapshot sees it
                # (unless it was pruned meanwhile: then the insert is tried again).
                row = conn.execute(_JOB_BY_KEY, params).fetchone()
            else:
                conn.execute(_NOTIFY, params)
        job = _job(row)
        payload_sha256 = digest(params["payload"])
        if not row["same"]:
            raise JobKeyConflictError(job, params["job_class"], payload_sha256)
        log.info(
            "%s job=%s class=%s payload_sha256=%s",
            "enqueued" if row["created"] else "enqueue repeated",
            job.id,
            job.job_class,
            payload_sha256,
        )
        return job

    def claim(self, job_class: str, owner_id: str) -> Lease | None:
        """The oldest queued job of the class, or one whose lease expired, under a new token
        and a lease of the class's length; None when there is none. Jobs of the class whose
        attempts are used up fail for good here, in the same transaction."""
        policy = self.policy(job_class)
        check_text("owner_id", owner_id, MAX_WORKER_ID_CHARS)
        params = {
            "job_class": job_class,
            "owner_id": owner_id,
            "lease": policy.lease,
            "max_attempts": policy.max_attempts,
            "error": _failure(FailureReason.ATTEMPTS_EXHAUSTED, {"code": "lease_expired"}),
        }
        # Four round trips: BEGIN, the claim, its event, COMMIT. Pipelining them into two was
        # measured slower on a local server (psycopg's pipeline costs more than it saves there).
        row = None
        with self._db.transaction() as conn:
            for found in conn.execute(_CLAIM, params).fetchall():
                if found["claimed"]:
                    row = found
                    continue
                append(
                    conn,
                    found,
                    "lease_released",
                    source=Source.COORDINATOR,
                    detail={
                        "outcome": Outcome.FAILED,
                        "reason": FailureReason.ATTEMPTS_EXHAUSTED,
                    },
                )
                log.warning(
                    "failed job=%s class=%s token=%d attempt=%d reason=%s",
                    found["id"],
                    job_class,
                    found["fencing_token"],
                    found["attempt"],
                    FailureReason.ATTEMPTS_EXHAUSTED,
                )
            if row is None:
                return None
            append(
                conn,
                row,
                "job_claimed",
                source=Source.COORDINATOR,
                lease_until=row["lease_until"],
                lease_duration_s=policy.lease_s,
                heartbeat_interval_s=policy.heartbeat_s,
            )
        lease = Lease(
            job_id=row["id"],
            job_class=job_class,
            owner_id=owner_id,
            fencing_token=row["fencing_token"],
            attempt=row["attempt"],
            lease_until=row["lease_until"],
            idempotency_key=row["idempotency_key"],
            payload=row["payload"],
            labels=row_labels(row),
        )
        log.info(
            "claimed job=%s class=%s token=%d attempt=%d owner=%s",
            lease.job_id,
            job_class,
            lease.fencing_token,
            lease.attempt,
            owner_id,
        )
        return lease

    def extend(self, lease: Lease) -> Lease | LeaseLost:
        """The heartbeat: the lease again for the class's length from the database's now, or
        `LeaseLost` when this owner no longer holds it (an answer, not an error to retry)."""
        policy = self.policy(lease.job_class)
        with self._db.transaction() as conn:
            row = self._while_held(conn, _EXTEND, {"lease": policy.lease}, lease, _EXTEND_REFUSED)
            if row is not None:
                append(conn, row, "heartbeat_ok", lease_until=row["lease_until"])
        if row is None:
            log.warning(
                "lease lost job=%s token=%d owner=%s",
                lease.job_id,
                lease.fencing_token,
                lease.owner_id,
            )
            return LeaseLost(lease.job_id, lease.fencing_token)
        log.debug("extended job=%s token=%d", lease.job_id, lease.fencing_token)
        return dataclasses.replace(lease, lease_until=row["lease_until"])

    def request_started(
        self,
        lease: Lease,
        *,
        request_id: str,
        effect_key: str | None = None,
        destination: str | None = None,
    ) -> Lease | LeaseLost:
        """Record `tool_request_started` before the request is sent, while the lease holds.

        `LeaseLost` means the lease no longer holds: do not send. `StoreUnavailableError` means
        it could not be recorded: do not send either. The event takes the job's next seq, so a
        request recorded before a takeover stays before it however late it is relayed.
        """
        check_text("request_id", request_id, MAX_KEY_CHARS)
        if effect_key is not None:
            check_text("effect_key", effect_key, MAX_KEY_CHARS)
        with self._db.transaction() as conn:
            row = self._while_held(
                conn, _REQUEST, {}, lease, _REQUEST_REFUSED, {"request": request_id}
            )
            if row is not None:
                append(
                    conn,
                    row,
                    "tool_request_started",
                    detail={"request": request_id},
                    request=request_id,
                    effect_key=effect_key,
                    destination=destination,
                )
        if row is None:
            log.warning(
                "request refused job=%s token=%d owner=%s request=%s",
                lease.job_id,
                lease.fencing_token,
                lease.owner_id,
                request_id,
            )
            return LeaseLost(lease.job_id, lease.fencing_token)
        log.info(
            "request started job=%s token=%d request=%s",
            lease.job_id,
            lease.fencing_token,
            request_id,
        )
        return lease

    def complete(self, lease: Lease, result: Any, *, then: Stage | None = None) -> Outcome:
        """Record the result, only while the lease holds; otherwise REJECTED and the job is
        left as it is (never shown as succeeded). `then`, the next stage of a chain, is
        enqueued in the same transaction: both happen, or neither (a key conflict of the next
        stage raises `JobKeyConflictError` and completes nothing)."""
        body = self._json("result", result)
        following = None if then is None else self._stage_params(then)
        with self._db.transaction() as conn:
            row = self._while_held(
                conn,
                _COMPLETE,
                {"result": body},
                lease,
                _RESULT_REJECTED,
                {"attempted": "complete", "result_sha256": digest(body)},
            )
            if row is not None:
                append(conn, row, "lease_released", detail={"outcome": Outcome.SUCCEEDED})
                if following is not None:
                    self._enqueue(conn, following)
        return self._answer(lease, Outcome.SUCCEEDED if row else Outcome.REJECTED, body)

    def fail(self, lease: Lease, error: Any, *, retryable: bool) -> Outcome:
        """Record a failed attempt, only while the lease holds: REQUEUED if the error is
        retryable and the class allows another attempt, else FAILED for good with the reason;
        REJECTED (nothing changed) when the lease no longer holds."""
        self._json("error", error)
        policy = self.policy(lease.job_class)
        delay_s = None
        if not retryable:
            outcome, reason = Outcome.FAILED, FailureReason.NOT_RETRYABLE
        elif lease.attempt >= policy.max_attempts:
            outcome, reason = Outcome.FAILED, FailureReason.ATTEMPTS_EXHAUSTED
        else:
            outcome, reason = Outcome.REQUEUED, FailureReason.RETRYING
            delay_s = policy.retry_delay_s(lease.attempt, _jitter.random())
        record = _failure(reason, error)
        state = JobState.QUEUED if outcome is Outcome.REQUEUED else JobState.FAILED
        params = {
            "state": state,
            "error": record,
            "delay": None if delay_s is None else timedelta(seconds=delay_s),
        }
        detail: dict[str, Any] = {"outcome": outcome, "reason": reason}
        if delay_s is not None:
            detail["retry_in_s"] = round(delay_s, 3)
        with self._db.transaction() as conn:
            row = self._while_held(
                conn, _FAIL, params, lease, _RESULT_REJECTED, {"attempted": "fail"}
            )
            if row is not None:
                append(conn, row, "lease_released", detail=detail)
        return self._answer(lease, outcome if row else Outcome.REJECTED, record)

    def cancel(self, job_id: UUID, *, by: str = "operator") -> Job | None:
        """An operator's stop of a queued or running job, as an ordered transition: the job
        takes the next token, held by `by` under no lease, and ends `cancelled`. The running
        owner's writes are refused from then on, a fenced destination refuses its fence, and
        the events (`job_claimed` by `by`, then `lease_released` with outcome `cancelled`)
        make any later effect of it stale to the detector. None when the job is not queued or
        running (finished already, or unknown)."""
        check_text("by", by, MAX_WORKER_ID_CHARS)
        with self._db.transaction() as conn:
            row = conn.execute(_CANCEL, {"job_id": job_id, "by": by}).fetchone()
            if row is None:
                return None
            detail = {"outcome": JobState.CANCELLED, "cancelled_state": row["was_state"]}
            taken = {**row, "event_seq": row["event_seq"] - 1}
            append(conn, taken, "job_claimed", source=Source.COORDINATOR, detail=detail)
            append(conn, row, "lease_released", source=Source.COORDINATOR, detail=detail)
            job = conn.execute(_JOB_BY_ID, (job_id,)).fetchone()
        assert job is not None
        log.warning(
            "cancelled job=%s token=%d was=%s by=%s",
            job_id,
            row["fencing_token"],
            row["was_state"],
            by,
        )
        return _job(job)

    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = DEFAULT_BATCH,
        relayed_only: bool = True,
        outbox_older_than: timedelta | None = None,
    ) -> Pruned:
        """Delete finished jobs older than `older_than` and outbox rows older than
        `outbox_older_than` (default: the same), a batch of jobs per transaction; with
        `relayed_only` (a store with a relay) only what the relay has published
        (`detector.leases.retention`)."""
        pruned = Pruned()
        while True:
            with self._db.transaction() as conn:
                step = prune_jobs(conn, older_than, batch, relayed_only=relayed_only)
            pruned += step
            if step.jobs < batch:
                break
        with self._db.transaction() as conn:
            pruned += prune_relayed(
                conn, outbox_older_than or older_than, relayed_only=relayed_only
            )
        log.info(
            "pruned jobs=%d outbox_rows=%d receipts=%d",
            pruned.jobs,
            pruned.outbox_rows,
            pruned.receipts,
        )
        return pruned

    def read_gauges(self, gauges: LeaseGauges) -> None:
        """Read the live lease gauges (`detector.leases.gauges`) in one snapshot."""
        with self._db.answering():
            gauges.refresh(self._db.connection())

    def job(self, job_id: UUID) -> Job | None:
        with self._db.transaction() as conn:
            row = conn.execute(_JOB_BY_ID, (job_id,)).fetchone()
        return None if row is None else _job(row)

    # -- internals --------------------------------------------------------------------------

    def _while_held(
        self,
        conn: psycopg.Connection[DictRow],
        statement: str,
        params: dict[str, Any],
        lease: Lease,
        refusal: _Refusal,
        detail: dict[str, Any] | None = None,
    ) -> DictRow | None:
        """Run a transition of the owner of `lease`, if its lease still holds; otherwise record
        the refusal as the job's next event and return None."""
        held = {
            "job_id": lease.job_id,
            "job_class": lease.job_class,
            "owner_id": lease.owner_id,
            "fencing_token": lease.fencing_token,
        }
        row = conn.execute(statement, {**held, **params}).fetchone()
        if row is None:
            job = next_seq(conn, lease.job_id)
            if job is not None:
                why: dict[str, str] = {"reason": _lost_reason(job, lease)}
                if refusal.kind == "heartbeat_lost":
                    why["refused"] = refusal.refused
                append(
                    conn,
                    job,
                    refusal.kind,
                    owner=(lease.owner_id, lease.fencing_token, lease.attempt),
                    source=refusal.source,
                    detail={**why, **(detail or {})},
                    destination=refusal.destination,
                )
        return row

    def _answer(self, lease: Lease, outcome: Outcome, body: str) -> Outcome:
        """Log a write's outcome: a refused one as a warning, with the hash of what was sent."""
        log.log(
            logging.WARNING if outcome is Outcome.REJECTED else logging.INFO,
            "%s job=%s token=%d attempt=%d owner=%s sha256=%s",
            outcome,
            lease.job_id,
            lease.fencing_token,
            lease.attempt,
            lease.owner_id,
            digest(body),
        )
        return outcome

    def policy(self, name: str) -> JobClass:
        """The class `name`; `LeaseInputError` naming the known ones if there is none."""
        try:
            return self._classes[name]
        except KeyError:
            known = ", ".join(sorted(self._classes)) or "none"
            raise LeaseInputError(
                "job_class", f"unknown job class {name!r} (known: {known})"
            ) from None

    def _json(self, field: str, value: Any) -> str:
        return json_text(field, value, self._max_payload_bytes)


def _lost_reason(job: DictRow, lease: Lease) -> LostReason:
    """Why the job row refuses `lease`'s owner, as the refusing transaction sees it."""
    if job["fencing_token"] != lease.fencing_token:
        return LostReason.CANCELLED if job["state"] == "cancelled" else LostReason.TAKEN_OVER
    if job["state"] != JobState.RUNNING:
        return LostReason.FINISHED
    return LostReason.EXPIRED


def _failure(reason: FailureReason, error: Any) -> str:
    """A job's `error`: why the attempt ended and the caller's error (the SQL adds `attempt`)."""
    return json.dumps({"reason": reason, "error": error}, ensure_ascii=False)


def _job(row: DictRow) -> Job:
    return Job(
        id=row["id"],
        job_class=row["job_class"],
        state=JobState(row["state"]),
        owner_id=row["owner_id"],
        fencing_token=row["fencing_token"],
        attempt=row["attempt"],
        lease_until=row["lease_until"],
        heartbeat_at=row["heartbeat_at"],
        idempotency_key=row["idempotency_key"],
        payload=row["payload"],
        result=row["result"],
        error=row["error"],
        labels=row_labels(row),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        not_before=row["not_before"],
        priority=row["priority"],
    )
