"""The worker loop against a real PostgreSQL: the heartbeat outlives a blocked event loop but not
a stuck executor, a lost lease cancels the tool and commits nothing, a timeout is retried under
the same idempotency key, and a store that stops answering makes ownership uncertain and stops
new requests.

Leases are one second long; a partition between the worker and the database is a loopback proxy
the test cuts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow

from detector.devstack.postgres import LocalPostgres
from detector.leases import LeaseStore
from detector.leases.db import connect
from detector.leases.heartbeat import Heartbeat
from detector.leases.runner import (
    FENCE_HEADER,
    IDEMPOTENCY_HEADER,
    Runner,
    Status,
    ToolCall,
    ToolFailed,
)
from detector.testing.proxy import TcpProxy
from tests.integration.leases import claimed, count, job_class

OCR = job_class("ocr", tool_timeout_s=1.5, stage_time_limit_s=30)
CLASSES = (OCR,)


@pytest.fixture
def store(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[LeaseStore]:
    with LeaseStore(postgres_dsn, CLASSES) as s:
        yield s


@pytest.fixture
def runner(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[Runner]:
    r = Runner(postgres_dsn, CLASSES, "w1", destination="ocr-api")
    yield r
    r.close()


def kinds(db: psycopg.Connection[DictRow]) -> list[tuple[str, int]]:
    """Every outbox event as (kind, token), in seq order, heartbeats left out."""
    rows = db.execute("SELECT event FROM tool_job_outbox ORDER BY job_id, seq").fetchall()
    return [
        (r["event"]["kind"], r["event"]["fencing_token"])
        for r in rows
        if r["event"]["kind"] != "heartbeat_ok"
    ]


def heartbeats(db: psycopg.Connection[DictRow]) -> int:
    return count(
        db, "SELECT count(*) AS n FROM tool_job_outbox WHERE event->>'kind' = 'heartbeat_ok'"
    )


def wait_until(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_job_runs_with_its_fence_and_idempotency_key_and_succeeds(
    runner: Runner, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    job = store.enqueue("ocr", "doc:7:ocr", {"doc": 7})
    seen: list[dict[str, str]] = []

    async def tool(call: ToolCall) -> dict[str, int]:
        seen.append(call.headers())
        return {"pages": 3}

    execution = asyncio.run(runner.run_one("ocr", tool))
    assert execution is not None and execution.status is Status.SUCCEEDED
    assert seen == [
        {
            FENCE_HEADER: "1",
            IDEMPOTENCY_HEADER: "doc:7:ocr",
            "X-Execution-Job": str(job.id),
            "X-Execution-Worker": "w1",
        }
    ]
    assert kinds(db) == [("job_claimed", 1), ("tool_request_started", 1), ("lease_released", 1)]
    finished = store.job(job.id)
    assert finished is not None and finished.result == {"pages": 3}
    assert asyncio.run(runner.run_one("ocr", tool)) is None  # nothing left to claim


def test_the_heartbeat_keeps_the_lease_while_the_tool_blocks_the_event_loop(
    runner: Runner, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """A tool that blocks the loop for longer than the lease (but less than its timeout) keeps
    its job: the heartbeat is a thread of its own."""
    store.enqueue("ocr", "doc:8:ocr", {"doc": 8})
    held: list[bool] = []

    async def blocking(call: ToolCall) -> str:
        # The loop is blocked (no await) until the lease the job had when the tool started has
        # run out on the database's clock; the job's lease then still runs, extended meanwhile.
        claimed_until = lease_until(db)
        wait_until(lambda: past(db, claimed_until), "the claimed lease to run out")
        held.append(not past(db, lease_until(db)))
        return "ok"

    execution = asyncio.run(runner.run_one("ocr", blocking))
    assert held == [True]
    assert execution is not None and execution.status is Status.SUCCEEDED
    assert heartbeats(db) >= 1


def lease_until(db: psycopg.Connection[DictRow]) -> datetime:
    """The lease of the one job in the store."""
    row = db.execute("SELECT lease_until FROM tool_jobs").fetchone()
    assert row is not None and row["lease_until"] is not None
    return cast(datetime, row["lease_until"])


def past(db: psycopg.Connection[DictRow], moment: datetime) -> bool:
    """Whether `moment` has passed on the database's clock."""
    row = db.execute("SELECT clock_timestamp() > %s AS past", (moment,)).fetchone()
    assert row is not None
    return bool(row["past"])


def test_a_stuck_executor_does_not_keep_its_lease_alive(
    runner: Runner, store: LeaseStore, postgres_dsn: str
) -> None:
    """The loop blocked past the tool timeout: the heartbeat stops extending, the lease lapses,
    another worker claims, and the stuck worker's late result is refused."""
    job = store.enqueue("ocr", "doc:9:ocr", {"doc": 9})
    taken = threading.Event()
    started = threading.Event()

    def second_worker() -> None:
        assert started.wait(20)
        with LeaseStore(postgres_dsn, CLASSES) as other:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if other.claim("ocr", "w2") is not None:
                    taken.set()
                    return
                time.sleep(0.05)

    thief = threading.Thread(target=second_worker)
    thief.start()

    async def stuck(call: ToolCall) -> str:
        # Blocks the loop until the other worker has the job (bounded, so a failure ends).
        started.set()
        taken.wait(20)
        return "late"

    execution = asyncio.run(runner.run_one("ocr", stuck))
    thief.join()
    assert taken.is_set()
    assert execution is not None
    assert execution.status in {Status.REJECTED, Status.LEASE_LOST}
    now = store.job(job.id)
    assert now is not None and now.fencing_token == 2 and now.result is None


def test_a_lost_lease_cancels_the_tool_and_commits_nothing(
    runner: Runner, store: LeaseStore, db: psycopg.Connection[DictRow], postgres_dsn: str
) -> None:
    job = store.enqueue("ocr", "doc:10:ocr", {"doc": 10})
    started = threading.Event()
    cancelled = threading.Event()

    async def slow(call: ToolCall) -> str:
        started.set()
        try:
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    def displace() -> None:
        started.wait(10)
        # An operator (or a clock gone wrong) ends the lease; another worker claims.
        with connect(postgres_dsn) as conn:
            conn.execute("UPDATE tool_jobs SET lease_until = now() WHERE id = %s", (job.id,))
        with LeaseStore(postgres_dsn, CLASSES) as other:
            assert other.claim("ocr", "w2") is not None

    thief = threading.Thread(target=displace)
    thief.start()
    execution = asyncio.run(runner.run_one("ocr", slow))
    thief.join()
    assert execution is not None and execution.status is Status.LEASE_LOST
    assert cancelled.is_set()
    assert kinds(db) == [
        ("job_claimed", 1),
        ("tool_request_started", 1),
        ("job_claimed", 2),
        ("heartbeat_lost", 1),
    ]
    now = store.job(job.id)
    assert now is not None and now.owner_id == "w2" and now.result is None


def test_a_tool_timeout_is_retried_with_the_same_idempotency_key(
    runner: Runner, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "payment:inv-42:capture", {"invoice": 42})
    keys: list[tuple[str, str, int]] = []

    async def flaky(call: ToolCall) -> str:
        keys.append(
            (call.headers()[IDEMPOTENCY_HEADER], call.headers()[FENCE_HEADER], call.try_number)
        )
        if call.try_number == 1:
            await asyncio.sleep(10)  # past the 1.5 s client timeout
        return "captured"

    execution = asyncio.run(runner.run_one("ocr", flaky))
    assert execution is not None and execution.status is Status.SUCCEEDED
    assert keys == [("payment:inv-42:capture", "1", 1), ("payment:inv-42:capture", "1", 2)]
    assert [k for k, _ in kinds(db)].count("tool_request_started") == 2


def test_a_tool_error_that_is_not_retryable_fails_the_job_for_good(
    runner: Runner, store: LeaseStore
) -> None:
    job = store.enqueue("ocr", "doc:11:ocr", {"doc": 11})

    async def refusing(call: ToolCall) -> str:
        raise ToolFailed("unsupported_format", retryable=False)

    execution = asyncio.run(runner.run_one("ocr", refusing))
    assert execution is not None
    assert (execution.status, execution.reason) == (Status.FAILED, "unsupported_format")
    now = store.job(job.id)
    assert now is not None and now.error["reason"] == "not_retryable"


def test_a_store_that_stops_answering_makes_ownership_uncertain_and_stops_new_requests(
    postgres_dsn: str,
    store: LeaseStore,
    db: psycopg.Connection[DictRow],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database is cut off during a tool call that then times out: the retry is not sent,
    because its `tool_request_started` cannot be recorded."""
    job = store.enqueue("ocr", "doc:12:ocr", {"doc": 12})
    params = conninfo_to_dict(postgres_dsn)
    with TcpProxy(str(params.get("host", "127.0.0.1")), int(str(params["port"]))) as proxy:
        cut_dsn = make_conninfo(postgres_dsn, port=str(proxy.port), connect_timeout="2")
        runner = Runner(cut_dsn, CLASSES, "w1")
        calls: list[int] = []

        async def hanging(call: ToolCall) -> str:
            calls.append(call.try_number)
            proxy.cut()
            await asyncio.sleep(10)  # past the 1.5 s client timeout
            return "never"

        with caplog.at_level(logging.WARNING, logger="detector.leases"):
            try:
                execution = asyncio.run(runner.run_one("ocr", hanging))
            finally:
                runner.close()
    assert execution is not None and execution.status is Status.OWNERSHIP_UNCERTAIN
    assert calls == [1]
    assert any(f"ownership uncertain job={job.id} token=1" in r.message for r in caplog.records)
    assert [k for k, _ in kinds(db)] == ["job_claimed", "tool_request_started"]


def test_the_local_lease_count_starts_when_the_claim_was_sent_and_a_late_extension_is_named(
    postgres_dsn: str, store: LeaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim sent L - J ago (its answer held up on the way back) is no longer presumed held,
    however recently it returned; its heartbeat, already overdue, extends at once and says it
    extends late (less than a period and the reserve left); the extension's lease is counted
    from when it was sent, and is presumed held again."""
    store.enqueue("ocr", "doc:1:ocr", {})
    sent = time.monotonic()
    lease = claimed(store.claim("ocr", "w1"))
    caplog.set_level(logging.WARNING, logger="detector.leases.heartbeat")
    with LeaseStore(postgres_dsn, CLASSES) as beat_store:
        fresh = Heartbeat(beat_store, lease, OCR, on_lost=lambda: None, on_uncertain=print)
        assert fresh.presumed_held()  # counted from now: what the claim's return would give
        beat = Heartbeat(
            beat_store,
            lease,
            OCR,
            on_lost=lambda: None,
            on_uncertain=print,
            claim_sent=sent - (OCR.lease_s - OCR.reserve_s),
        )
        assert not beat.presumed_held()
        beat.start()
        wait_until(lambda: beat.lease.lease_until > lease.lease_until, "the first extension")
        beat.finish()
        beat.join()
    assert beat.presumed_held() and not beat.lost
    assert any(r.message.startswith("extend late") for r in caplog.records)


def test_ownership_uncertain_is_recorded_when_a_failure_cannot_be_written(
    postgres_dsn: str,
    store: LeaseStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tool's own error comes back while the database is cut off: the failure cannot be
    recorded, and ownership uncertain is recorded on that path too; the call's duration and
    outcome are logged."""
    job = store.enqueue("ocr", "doc:13:ocr", {"doc": 13})
    params = conninfo_to_dict(postgres_dsn)
    with TcpProxy(str(params.get("host", "127.0.0.1")), int(str(params["port"]))) as proxy:
        cut_dsn = make_conninfo(postgres_dsn, port=str(proxy.port), connect_timeout="2")
        runner = Runner(cut_dsn, CLASSES, "w1")

        async def failing(call: ToolCall) -> str:
            proxy.cut()
            raise ToolFailed("http_503", retryable=True)

        with caplog.at_level(logging.INFO, logger="detector.leases"):
            try:
                execution = asyncio.run(runner.run_one("ocr", failing))
            finally:
                runner.close()
    assert execution is not None and execution.status is Status.OWNERSHIP_UNCERTAIN
    messages = [r.message for r in caplog.records]
    assert any(f"ownership uncertain job={job.id} token=1" in m for m in messages)
    assert any(
        m.startswith(f"tool call job={job.id} token=1 try=1 class=None outcome=failed:http_503")
        and "duration_s=" in m
        for m in messages
    )


def test_any_exception_of_the_tool_is_a_failed_attempt_and_the_worker_goes_on(
    runner: Runner, store: LeaseStore
) -> None:
    """A tool that raises what a client library raises (`raise_for_status()`): each attempt
    fails and is retried by the store, until its attempts run out; nothing raises into the
    worker's loop."""
    job = store.enqueue("ocr", "doc:21:ocr", {"doc": 21})

    async def tool(call: ToolCall) -> str:
        raise RuntimeError("503 Server Error: Service Unavailable for url: http://ocr")

    async def every_attempt() -> list[Any]:
        return [await runner.run_one("ocr", tool) for _ in range(OCR.max_attempts)]

    executions = asyncio.run(every_attempt())
    assert [(e.attempt, e.status, e.reason) for e in executions] == [
        (1, Status.REQUEUED, "tool_error:RuntimeError"),
        (2, Status.REQUEUED, "tool_error:RuntimeError"),
        (3, Status.FAILED, "tool_error:RuntimeError"),
    ]
    now = store.job(job.id)
    assert now is not None and now.state == "failed"
    assert now.error["reason"] == "attempts_exhausted"


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("result", "why"),
    [
        ({"text": "a\x00b"}, "NUL"),
        ("\ud800", "surrogate"),
        (nested(5000), "deep"),
    ],
    ids=["nul", "lone-surrogate", "5000-deep"],
)
def test_a_result_the_database_cannot_store_fails_the_job_for_good_and_the_worker_survives(
    runner: Runner, store: LeaseStore, result: Any, why: str
) -> None:
    """The tool's effect is done, so running it again would repeat it: the job fails for good,
    naming why, and nothing raises into the worker."""
    job = store.enqueue("ocr", f"doc:{why}:ocr", {})

    async def tool(call: ToolCall) -> Any:
        return result

    execution = asyncio.run(runner.run_one("ocr", tool))
    assert execution is not None
    assert (execution.status, execution.reason) == (Status.FAILED, "result_unstorable:result")
    now = store.job(job.id)
    assert now is not None and now.state == "failed" and now.result is None


def test_a_database_restart_during_the_tool_call_keeps_its_result_and_does_not_run_it_again(
    postgres: LocalPostgres, postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    """The final write meets the restarted server's closed connection: it is tried again
    within the lease, so the finished result is recorded and the tool runs once."""
    # Long enough for a restart on a loaded machine: the lease outlives it.
    slow = job_class(
        "ocr-restart", lease_s=60, tool_timeout_s=60, stage_time_limit_s=120, reserve_s=10
    )
    with LeaseStore(postgres_dsn, (slow,)) as store:
        job = store.enqueue("ocr-restart", "doc:31:ocr", {"doc": 31})
    runner = Runner(postgres_dsn, (slow,), "w1")
    calls: list[int] = []

    async def tool(call: ToolCall) -> str:
        calls.append(call.try_number)
        await asyncio.to_thread(postgres.restart, crash=True)
        return "recognised text"

    try:
        execution = asyncio.run(runner.run_one("ocr-restart", tool))
    finally:
        runner.close()
    assert execution is not None and execution.status is Status.SUCCEEDED
    assert calls == [1]
    with connect(postgres_dsn) as after:  # the test's own session did not outlive the restart
        row = after.execute(
            "SELECT state, result FROM tool_jobs WHERE id = %s", (job.id,)
        ).fetchone()
    assert row is not None and (row["state"], row["result"]) == ("succeeded", "recognised text")


def test_a_session_frozen_in_a_transaction_holds_its_job_no_longer_than_its_lease(
    postgres_dsn: str, store: LeaseStore
) -> None:
    """The server ends a store's session idle inside a transaction within the class's lease,
    not after its default minute."""
    with store._db.transaction() as conn:  # the session the store writes with
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert row is not None and row["idle_in_transaction_session_timeout"] == "1s"
