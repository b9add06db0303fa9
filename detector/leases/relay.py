"""The outbox relay: publishes `tool_job_outbox` to `agent.ownership.v1`, at least once.

A batch is published and acknowledged by Kafka before its rows are marked relayed, in the same
database transaction that locked them. Each job's events reach the topic in seq order, also
with several relays: a batch takes jobs, not rows, each under a transaction-scoped advisory lock
that other relays skip (so they share the work by job and never publish one row at the same
time), and of each job the unrelayed rows of lowest seq. A crash, a broker that does not
acknowledge, or a database that goes away between the two leaves the rows unmarked: they are
published again, with the event id they were written with, which the detector ignores as a
redelivery (a redelivery repeats a prefix of the job's events: their first publications stay in
seq order). Relayed rows are deleted once they are older than the retention, so the table holds
the recent past for `leases inspect` and investigations, not the whole history.

A row that is not a valid event (the store validates what it writes, so only a row written by
hand or by an older version) goes to the DLQ topic instead, as stored, with the reason in its
headers (`OutboxDeadLetter`), and is marked relayed with the others: bad input is never lost, and
never stops the relay. The job's later rows are published after it as usual.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import psycopg
from psycopg.rows import DictRow

from detector.closing import Closing
from detector.contracts.dead_letters import OutboxDeadLetter
from detector.contracts.events import EventError, parse_event_strict
from detector.contracts.topics import DLQ_TOPIC, INPUT_TOPIC
from detector.kafka.config import KafkaClientError
from detector.kafka.emit import DeliveryError, Emitter
from detector.leases.db import Database
from detector.leases.errors import StoreUnavailableError
from detector.leases.gauges import LeaseGauges
from detector.leases.retention import DEFAULT_JOB_RETENTION, Pruned, prune_jobs, prune_relayed

log = logging.getLogger(__name__)

_BATCH: Final = 500
DEFAULT_RETENTION: Final = timedelta(hours=24)
# How long a batch may wait for Kafka's acknowledgements before it is left for the next try.
DEFAULT_ACK_TIMEOUT_S: Final = 30.0

# The jobs whose unrelayed rows are oldest, looked up among the oldest rows through the index on
# unrelayed rows, leaving out jobs already found held by another relay.
_WINDOW: Final = """
WITH oldest AS MATERIALIZED (
    SELECT job_id, created_at FROM tool_job_outbox
     WHERE relayed_at IS NULL AND job_id <> ALL(%(skip)s::uuid[])
     ORDER BY created_at
     LIMIT %(scan)s
)
SELECT job_id FROM oldest GROUP BY job_id ORDER BY min(created_at)
"""
# Of those jobs, in order, each kept only if this relay takes its advisory lock, until `jobs` are
# taken. The lock lasts until the transaction ends: after the marks are committed, or after a
# failure that marked nothing. Another relay skips a locked job, so a job is relayed by one relay
# at a time, and the next to lock it finds its rows up to the last published one already marked.
_LOCK_SPACE: Final = 0x5B1A  # the first key of the two-key advisory locks the relays take
_LOCK: Final = """
WITH candidates AS MATERIALIZED (
    SELECT job_id, n FROM unnest(%(candidates)s::uuid[]) WITH ORDINALITY AS c(job_id, n)
     ORDER BY n
)
SELECT job_id FROM candidates
 WHERE pg_try_advisory_xact_lock(%(space)s, hashtext(job_id::text))
 LIMIT %(jobs)s
"""
# How many windows a relay looks at when every job in one is held by another relay: a backlog
# whose oldest rows are all one long job's would otherwise leave every relay but one idle.
_WINDOWS: Final = 4
# Of the jobs this relay locked, the unrelayed rows of lowest seq. A job's rows commit in seq
# order (each transition holds the job row's lock while it takes its seq and writes its row), so
# this statement, which starts after the lock was taken, sees every row below the highest it
# returns: a job's rows are published in seq order, across batches and across relays. `FOR
# UPDATE` waits for a relay of an earlier version that holds some of them (it takes no advisory
# lock) and skips what that relay marked.
_PENDING: Final = """
SELECT job_id, seq, event FROM tool_job_outbox
 WHERE relayed_at IS NULL AND job_id = ANY(%(jobs)s)
 ORDER BY job_id, seq
 LIMIT %(rows)s
   FOR UPDATE
"""
_MARK: Final = """
UPDATE tool_job_outbox AS o SET relayed_at = now()
  FROM unnest(%s::uuid[], %s::bigint[]) AS done(job_id, seq)
 WHERE o.job_id = done.job_id AND o.seq = done.seq
"""


@dataclass(frozen=True, slots=True)
class Batch:
    """One relay step: the rows published and those dead-lettered, all marked relayed, and
    what was pruned."""

    published: int
    pruned: Pruned
    dead_lettered: int = 0

    @property
    def relayed(self) -> int:
        return self.published + self.dead_lettered


class OutboxRelay(Closing):
    """Relays the outbox of the lease store at `dsn` through an `Emitter` of `kafka_config`:
    its events to `topic`, a row that is no valid event to `dlq_topic`."""

    def __init__(
        self,
        dsn: str,
        kafka_config: Mapping[str, Any],
        *,
        topic: str = INPUT_TOPIC,
        dlq_topic: str = DLQ_TOPIC,
        batch: int = _BATCH,
        retention: timedelta = DEFAULT_RETENTION,
        job_retention: timedelta = DEFAULT_JOB_RETENTION,
        ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
        gauges: LeaseGauges | None = None,
    ) -> None:
        self.gauges = gauges
        self._db = Database(dsn)
        self._dlq_topic = dlq_topic
        self._batch = batch
        self._retention = retention
        self._job_retention = job_retention
        self._ack_timeout_s = ack_timeout_s
        self._kafka = (kafka_config, topic)
        self._emitter = Emitter(kafka_config, topic=topic)
        self.published = 0
        self.dead_lettered = 0

    def close(self) -> None:
        self._emitter.close()
        self._db.close()

    def step(self, *, prune: bool = True) -> Batch:
        """Publish one batch of unrelayed rows (a row that is no valid event to the DLQ topic),
        then mark them relayed; with `prune`, delete the relayed rows older than the retention
        and a batch of the finished jobs older than the job retention
        (`detector.leases.retention`).

        Raises `StoreUnavailableError` when the database does not answer and `DeliveryError`
        when Kafka did not acknowledge the batch: either way nothing was marked, and the rows
        go out again on the next step.
        """
        try:
            with self._db.transaction() as conn:
                rows = self._take(conn)
                dead = sum(not self._publish(row) for row in rows)
                if rows:
                    self._emitter.flush(self._ack_timeout_s)
                    conn.execute(_MARK, ([r["job_id"] for r in rows], [r["seq"] for r in rows]))
                pruned = Pruned()
                if prune:
                    pruned = prune_relayed(conn, self._retention) + prune_jobs(
                        conn, self._job_retention
                    )
        except DeliveryError:
            # What librdkafka still holds would be delivered behind the next step's copy of it:
            # drop it, so that a broker that is down does not grow the queue by a batch a try.
            self._emitter.close()
            self._emitter = Emitter(self._kafka[0], topic=self._kafka[1])
            raise
        self.published += len(rows) - dead
        self.dead_lettered += dead
        if self.gauges is not None:
            self.gauges.stepped(len(rows) - dead, dead)
        return Batch(len(rows) - dead, pruned, dead)

    def _publish(self, row: DictRow) -> bool:
        """Send the row's event to the topic; False when it is no valid event, and was sent to
        the DLQ topic instead."""
        try:
            if not isinstance(row["event"], dict):
                raise EventError("not a JSON object")
            event = parse_event_strict(row["event"])
        except EventError as exc:
            dead = OutboxDeadLetter(
                f"invalid: {exc.reason}",
                exc.field,
                str(row["job_id"]),
                row["seq"],
                json.dumps(row["event"], ensure_ascii=False).encode(),
            )
            self._emitter.dead_letter(
                self._dlq_topic, dead.job_id.encode(), dead.value, dead.headers()
            )
            log.error(
                "outbox row job=%s seq=%d is no valid event (%s): sent to %s",
                dead.job_id,
                dead.seq,
                exc,
                self._dlq_topic,
            )
            return False
        self._emitter.emit(event)
        return True

    def _take(self, conn: psycopg.Connection[DictRow]) -> list[DictRow]:
        """Lock up to a batch of jobs and take up to a batch of their unrelayed rows, each
        job's in seq order (the transaction's advisory locks keep other relays off them)."""
        held: list[Any] = []  # jobs another relay holds: the next window looks past them
        for _ in range(_WINDOWS):
            window = {"skip": held, "scan": 4 * self._batch}
            candidates = [r["job_id"] for r in conn.execute(_WINDOW, window).fetchall()]
            if not candidates:
                return []
            lock = {"candidates": candidates, "space": _LOCK_SPACE, "jobs": self._batch}
            jobs = [r["job_id"] for r in conn.execute(_LOCK, lock).fetchall()]
            if jobs:
                return conn.execute(_PENDING, {"jobs": jobs, "rows": self._batch}).fetchall()
            held += candidates
        return []

    def refresh_gauges(self) -> None:
        """Read the live lease gauges (`detector.leases.gauges`); `StoreUnavailableError` when
        the database does not answer (the gauges then keep their last values, and the last
        step's time shows the stall)."""
        if self.gauges is None:
            return
        with self._db.answering():
            self.gauges.refresh(self._db.connection())

    def run(
        self,
        stop: threading.Event,
        *,
        idle_s: float = 0.2,
        retry_s: float = 1.0,
        prune_every_s: float = 60.0,
        gauges_every_s: float = 5.0,
    ) -> None:
        """Relay until `stop` is set: at once while there is a backlog, every `idle_s` when
        there is none, and every `retry_s` while the database or Kafka does not answer;
        pruning every `prune_every_s`, and reading the gauges every `gauges_every_s`."""
        failing = False
        pruned_at = -prune_every_s
        read_at = -gauges_every_s
        while not stop.is_set():
            prune = time.monotonic() - pruned_at >= prune_every_s
            try:
                if time.monotonic() - read_at >= gauges_every_s:
                    read_at = time.monotonic()
                    self.refresh_gauges()
                batch = self.step(prune=prune)
            except (StoreUnavailableError, DeliveryError) as exc:
                if not failing:
                    log.warning("relay paused: %s", exc)
                failing = True
                stop.wait(retry_s)
                continue
            except KafkaClientError:
                raise  # a wrong password or a missing topic: retrying cannot help
            if prune:
                pruned_at = time.monotonic()
            if failing:
                log.info("relay resumed")
                failing = False
            if batch.relayed:
                log.debug("relayed %d event(s), pruned %s", batch.relayed, batch.pruned)
            else:
                stop.wait(idle_s)


def relay_until_empty(relay: OutboxRelay, timeout_s: float = 60.0) -> int:
    """Step until a step finds nothing to relay; the number published (not counting the rows
    dead-lettered). For tools and tests that need the outbox drained now (the long-running form
    is `OutboxRelay.run`)."""
    deadline = time.monotonic() + timeout_s
    total = 0
    while (batch := relay.step()).relayed:
        total += batch.published
        if time.monotonic() > deadline:
            raise TimeoutError(f"the outbox was not drained within {timeout_s:g}s")
    return total
