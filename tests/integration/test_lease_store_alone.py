"""The lease store as a job queue with no Kafka in the environment: jobs run without an emitter,
and `leases prune --without-relay` and `leases maintain` keep the store bounded and serve its
gauges, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import psycopg
from psycopg.rows import DictRow

from detector.devstack.process import free_port
from detector.leases import LeaseStore
from detector.leases.runner import Runner, ToolCall
from tests.integration.leases import job_class

OCR = job_class("ocr")


def without_kafka(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLITBRAIN_")}
    return {**env, "SPLITBRAIN_LEASES_DSN": dsn}


def splitbrain(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detector.cli", "leases", *args],
        env=without_kafka(dsn),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def finish_jobs(dsn: str, n: int, tag: str) -> None:
    """`n` jobs enqueued, run and succeeded by a runner with no emitter; then aged 30 days."""
    with LeaseStore(dsn, [OCR]) as store:
        for i in range(n):
            store.enqueue("ocr", f"doc:{tag}{i}:ocr", {"doc": i})
    runner = Runner(dsn, [OCR], "w1")

    async def tool(call: ToolCall) -> Any:
        return {"pages": 1}

    async def run_all() -> list[Any]:
        return [await runner.run_one("ocr", tool) for _ in range(n)]

    try:
        assert all(e is not None and e.status == "succeeded" for e in asyncio.run(run_all()))
    finally:
        runner.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE tool_jobs SET updated_at = now() - interval '30 days'")
        conn.execute("UPDATE tool_job_outbox SET created_at = now() - interval '30 days'")


def counts(db: psycopg.Connection[DictRow]) -> tuple[int, int]:
    jobs = db.execute("SELECT count(*) AS n FROM tool_jobs WHERE state = 'succeeded'").fetchone()
    rows = db.execute("SELECT count(*) AS n FROM tool_job_outbox").fetchone()
    assert jobs is not None and rows is not None
    return int(jobs["n"]), int(rows["n"])


def test_prune_without_a_relay_removes_old_jobs_and_outbox_rows_nobody_relayed(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    finish_jobs(postgres_dsn, 3, "p")
    jobs, rows = counts(db)
    assert jobs == 3 and rows > 3

    kept = splitbrain(postgres_dsn, "prune", "--older-than", "1")
    assert kept.returncode == 0, kept.stderr
    assert counts(db) == (jobs, rows)  # a store with a relay keeps what was never relayed

    pruned = splitbrain(postgres_dsn, "prune", "--older-than", "1", "--without-relay")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith(f"pruned 3 finished jobs, {rows} outbox rows")
    assert counts(db) == (0, 0)


def test_maintain_prunes_and_serves_the_gauges_with_no_kafka(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    finish_jobs(postgres_dsn, 2, "m")
    with LeaseStore(postgres_dsn, [OCR]) as store:
        store.enqueue("ocr", "doc:waiting:ocr", {})
    metrics = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "detector.cli", "leases", "maintain", "--without-relay"),
            *("--metrics-port", str(metrics), "--prune-every-s", "0.2"),
        ],
        env=without_kafka(postgres_dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while counts(db)[0] or not queued_gauge(metrics):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "not pruned and served within 60 s"
            time.sleep(0.2)
        assert counts(db)[0] == 0
        assert (
            queued_gauge(metrics)
            == 'splitbrain_lease_store_jobs{job_class="ocr",state="queued"} 1.0'
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def queued_gauge(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return next(
        (
            line
            for line in text.splitlines()
            if line.startswith("splitbrain_lease_store_jobs{") and 'state="queued"' in line
        ),
        None,
    )
