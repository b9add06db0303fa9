"""The worker the lease store's page shows (`examples/lease_worker.py`, included verbatim), run as
a reader runs it, against a real PostgreSQL and the example destination, with no Kafka: its
capture lands at the destination once, under the fence the store issued, and the job succeeds
with the destination's receipt as its result; SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
from psycopg.rows import DictRow

from detector.contracts.events import Kind, Source, parse_event_obj
from detector.leases.http_destination import DEFAULT_NAME, DestinationServer
from tests.integration.leases import outbox
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "lease_worker.py"
INVOICE = "invoice-42"
ENDED_WITHIN_S = 60


def start(dsn: str, destination: str) -> subprocess.Popen[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPLITBRAIN_")}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), destination, INVOICE],
        env={**env, "SPLITBRAIN_LEASES_DSN": dsn, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ended(db: psycopg.Connection[DictRow], proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The invoice's job once it is no longer queued or running; the worker must keep running."""
    deadline = time.monotonic() + ENDED_WITHIN_S
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        job = db.execute(
            "SELECT id, state, fencing_token, attempt, result, error FROM tool_jobs"
            " WHERE idempotency_key = %s",
            (f"payment:{INVOICE}:capture",),
        ).fetchone()
        if job is not None and job["state"] not in {"queued", "running"}:
            return job
        assert time.monotonic() < deadline, f"the job did not end within {ENDED_WITHIN_S} s"
        time.sleep(0.1)


def test_the_documented_worker_captures_once_under_the_jobs_fence(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    with DestinationServer(postgres_dsn, DEFAULT_NAME) as server:
        proc = start(postgres_dsn, server.url)
        try:
            job = ended(db, proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            log, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log
    assert (job["state"], job["fencing_token"], job["attempt"]) == ("succeeded", 1, 1), job
    landed = db.execute(
        "SELECT id, entity, idempotency_key, fence, payload FROM fenced_effects"
    ).fetchall()
    assert landed == [
        {
            "id": job["result"]["effect_id"],
            "entity": INVOICE,
            "idempotency_key": f"payment:{INVOICE}:capture",
            "fence": 1,
            "payload": {"amount": 42},
        }
    ]
    # The claim, the request recorded before it was sent, the destination's receipt, the end:
    # all under epoch 1, in the job's order.
    events = [parse_event_obj(e) for e in outbox(db, job["id"])]
    assert [(e.kind, e.source, e.owner_epoch) for e in events] == [
        (Kind.LEASE_ACQUIRED, Source.COORDINATOR, 1),
        (Kind.EFFECT_ATTEMPTED, Source.WORKER, 1),
        (Kind.EFFECT_COMMITTED, Source.DESTINATION, 1),
        (Kind.LEASE_RELEASED, Source.WORKER, 1),
    ]
