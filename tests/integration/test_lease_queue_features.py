"""What a team moving from River or Oban expects of the lease store (issue 38), against a real
PostgreSQL: an enqueue in the application's own transaction, a time to run at, priorities,
several jobs at once per runner, and a runner woken by the enqueue rather than its poll."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.leases import LeaseInputError, LeaseStore, Runner, Status, ToolCall
from tests.integration.leases import claimed, count, job_class

OCR = job_class("ocr")


def test_a_job_enqueued_in_the_application_s_transaction_exists_only_if_it_commits(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    with LeaseStore(postgres_dsn, [OCR]) as store, psycopg.connect(postgres_dsn) as app:
        app.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        app.commit()
        app.execute("INSERT INTO orders VALUES (1)")
        store.enqueue("ocr", "order:1:ocr", {"order": 1}, connection=app)
        app.rollback()
        assert store.claim("ocr", "w1") is None
        app.execute("INSERT INTO orders VALUES (2)")
        job = store.enqueue("ocr", "order:2:ocr", {"order": 2}, connection=app)
        assert store.claim("ocr", "w1") is None  # not committed yet: not visible
        app.commit()
        assert claimed(store.claim("ocr", "w1")).job_id == job.id


def test_a_job_waits_for_its_time_and_priorities_come_before_age(postgres_dsn: str) -> None:
    held = job_class("ocr", lease_s=60)  # the claimed jobs keep their leases throughout
    with LeaseStore(postgres_dsn, [held]) as store:
        later = store.enqueue(
            "ocr", "doc:later", {}, run_at=datetime.now(UTC) + timedelta(seconds=1)
        )
        low = store.enqueue("ocr", "doc:low", {}, priority=5)
        high = store.enqueue("ocr", "doc:high", {}, priority=1)
        first = store.enqueue("ocr", "doc:first", {})
        order = [claimed(store.claim("ocr", "w1")).job_id for _ in range(3)]
        assert order == [first.id, high.id, low.id]
        assert store.claim("ocr", "w1") is None
        time.sleep(1.1)  # run_at is compared with the database's now(); both clocks are local
        assert claimed(store.claim("ocr", "w1")).job_id == later.id
        with pytest.raises(LeaseInputError, match="priority"):
            store.enqueue("ocr", "doc:bad", {}, priority=10)
        with pytest.raises(LeaseInputError, match="run_at"):
            store.enqueue("ocr", "doc:naive", {}, run_at=datetime(2030, 1, 1))


def test_a_runner_runs_its_concurrency_at_once_and_wakes_on_an_enqueue(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    async def scenario() -> tuple[list[Any], float]:
        together = asyncio.Barrier(4)
        stop = asyncio.Event()
        woken_at: list[float] = []

        async def tool(call: ToolCall) -> dict[str, Any]:
            if call.payload.get("together"):
                await asyncio.wait_for(together.wait(), 10)  # only 4 at once can pass
            else:
                woken_at.append(time.monotonic())
                stop.set()
            return {"done": call.idempotency_key}

        with LeaseStore(postgres_dsn, [OCR]) as store:
            for n in range(4):
                store.enqueue("ocr", f"doc:{n}", {"together": True})
            runner = Runner(postgres_dsn, [OCR], "w1")
            try:
                # A poll every 60 s: only the enqueue's notification can wake the runner in time.
                running = asyncio.create_task(
                    runner.run("ocr", tool, stop, idle_s=60, concurrency=4)
                )
                while succeeded(db) < 4:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # every slot is idle now, waiting
                enqueued_at = time.monotonic()
                await asyncio.to_thread(store.enqueue, "ocr", "doc:wake", {})
                done = await asyncio.wait_for(running, 30)
            finally:
                runner.close()
        return done, woken_at[0] - enqueued_at

    done, wake_s = asyncio.run(scenario())
    assert [e.status for e in done] == [Status.SUCCEEDED] * 5
    assert wake_s < 5, f"woken {wake_s:.2f} s after the enqueue"


def succeeded(db: psycopg.Connection[DictRow]) -> int:
    return count(db, "SELECT count(*) AS n FROM tool_jobs WHERE state = 'succeeded'")
