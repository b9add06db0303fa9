"""The clean soak: many worker processes, many jobs, and random stalls (SIGSTOP, then SIGCONT)
all shorter than the slack L - R x H. A stall that short must cost nobody a lease: every job
succeeds on its first claim, nobody reports ownership uncertain, and the detector finds nothing
in the whole history."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
from psycopg.rows import DictRow

from detector.histories.audit import audit_lines
from detector.leases import LeaseStore
from tests.integration.leases import count, job_class

# Slack L - (R+1) x H = 1.5 s; stalls last at most 1 s, and a worker's heartbeat may have been due
# just before one starts (H + stall < L - J).
SOAK = job_class("soak", lease_s=3.0, heartbeat_s=0.5, reserve_s=1.0)
WORKERS = 6
JOBS = 60
MAX_STALL_S = 1.0


def finished(db: psycopg.Connection[DictRow]) -> int:
    return count(db, "SELECT count(*) AS n FROM tool_jobs WHERE state IN ('succeeded', 'failed')")


def test_clean_soak_with_stalls_shorter_than_the_slack_finds_nothing(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    assert MAX_STALL_S + SOAK.heartbeat_s < SOAK.lease_s - SOAK.reserve_s
    with LeaseStore(postgres_dsn, [SOAK]) as store:
        for n in range(JOBS):
            store.enqueue("soak", f"report:{n}:render", {"entity": f"report-{n}"})
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "detector.devstack.lease_worker",
                "--dsn",
                postgres_dsn,
                "--worker-id",
                f"w{i}",
                "--job-class",
                SOAK.model_dump_json(),
                "--work-s",
                "0.1:1.5",
                "--seed",
                str(i),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    rng = random.Random(7)
    stalls = 0
    try:
        deadline = time.monotonic() + 240
        while finished(db) < JOBS:
            assert time.monotonic() < deadline, f"{finished(db)} of {JOBS} jobs finished"
            victim = rng.choice(workers)
            assert victim.poll() is None, victim.communicate()[1][-3000:]
            victim.send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(0.2, MAX_STALL_S))  # the stall itself is what is tested
            victim.send_signal(signal.SIGCONT)
            stalls += 1
            time.sleep(rng.uniform(0.0, 0.3))
    finally:
        for w in workers:
            w.send_signal(signal.SIGCONT)
            w.terminate()
        outputs = [w.communicate(timeout=60) for w in workers]
    executions = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    logs = "".join(err for _, err in outputs)
    assert stalls >= 10
    assert sorted(e["status"] for e in executions) == ["succeeded"] * JOBS, logs[-3000:]
    assert "ownership uncertain" not in logs
    jobs = db.execute("SELECT state, fencing_token, attempt FROM tool_jobs").fetchall()
    assert {(j["state"], j["fencing_token"], j["attempt"]) for j in jobs} == {("succeeded", 1, 1)}
    events = db.execute("SELECT event FROM tool_job_outbox ORDER BY job_id, seq").fetchall()
    kinds = {r["event"]["kind"] for r in events}
    assert kinds == {"job_claimed", "heartbeat_ok", "tool_request_started", "lease_released"}
    history: list[dict[str, Any]] = [r["event"] for r in events]
    result = audit_lines(json.dumps(e).encode() for e in history)
    assert result.findings == {}
