"""`splitbrain probe` against the example destination, served by `splitbrain leases destination`
over a real PostgreSQL (issue 23): exit 0 against the fenced one, 1 against the unfenced one, 2
when it cannot run; it writes only under its key prefix. And against two faulty destinations
(issue 38): one that keeps the highest fence per entity only, and one that accepts any fence at
or above the job's token, each failing with the check it breaks named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.cli.main import main
from detector.devstack.process import free_port
from detector.errors import ExitCode
from detector.leases import LeaseStore
from detector.leases.db import connect
from tests.integration.leases import claimed, job_class


@contextmanager
def destination(dsn: str, *flags: str) -> Iterator[tuple[str, list[str]]]:
    """`splitbrain leases destination` on a free port: its URL and the options it says to probe
    it with (its two jobs and their tokens); stopped by SIGTERM to its PID."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SPLITBRAIN_")}
    service = subprocess.Popen(
        [sys.executable, "-m", "detector.cli", "leases", "destination", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "SPLITBRAIN_LEASES_DSN": dsn},
    )
    try:
        assert service.stdout is not None
        listening = service.stdout.readline()
        assert listening.startswith("listening on http://127.0.0.1:"), listening
        hint = service.stdout.readline().split()
        assert hint[:3] == ["probe", "it:", "splitbrain"], hint
        assert hint[5::2] == ["--job", "--fence", "--second-job", "--second-fence"], hint
        assert (hint[8], hint[12]) == ("2", "1"), hint  # the tokens the store issued
        yield hint[4], hint[5:]
    finally:
        service.send_signal(signal.SIGTERM)
        _, err = service.communicate(timeout=30)
        assert service.returncode == ExitCode.OK, err


def test_probe_passes_a_fenced_destination_and_writes_only_under_its_prefix(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    with destination(postgres_dsn) as (url, jobs):
        assert main(["probe", url, *jobs, "--key-prefix", "p1:"]) == ExitCode.OK
    out, err = capsys.readouterr()
    assert "every key and the entity under the prefix 'p1:'" in err
    assert out.splitlines()[-1] == "the destination enforces the fence"
    assert [line.split()[-1] for line in out.splitlines()[1:7]] == ["yes"] * 6
    rows = db.execute(
        "SELECT entity, idempotency_key, accepted FROM fenced_receipts ORDER BY created_at"
    ).fetchall()
    # Accepted once (the repeat is its receipt), the second job's accepted, refused three times.
    assert len(rows) == 5
    assert all(
        r["entity"].startswith("p1:") and r["idempotency_key"].startswith("p1:") for r in rows
    )
    assert [r["accepted"] for r in rows] == [True, True, False, False, False]
    # The service cancelled its two jobs when it stopped.
    states = db.execute("SELECT state FROM tool_jobs WHERE job_class = 'splitbrain-probe'")
    assert [r["state"] for r in states.fetchall()] == ["cancelled", "cancelled"]


def test_probe_fails_an_unfenced_destination_and_says_which_guarantees_broke(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    with destination(postgres_dsn, "--unfenced", "--name", "legacy") as (url, jobs):
        code = main(["probe", url, *jobs, "--format", "json"])
    assert code == ExitCode.FAILED
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "splitbrain.probe/v1" and document["fenced"] is False
    assert [(c["status"], c["holds"]) for c in document["checks"]] == [
        (200, True),
        (200, True),  # the same key and fence: answered from its receipt
        (200, True),  # the second job's own fence
        (200, False),  # a lower fence accepted
        (200, False),  # the successor's key under a lower fence: a second effect
        (200, False),  # a fence never issued accepted
    ]


def test_probe_cannot_run_against_nothing_or_an_unknown_job(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", f"http://127.0.0.1:{free_port()}"]) == ExitCode.UNUSABLE
    assert "splitbrain probe: no answer from 127.0.0.1" in capsys.readouterr().err
    with destination(postgres_dsn) as (url, jobs):
        assert main(["probe", url]) == ExitCode.UNUSABLE
        assert "the destination does not know job 00000000-0000-0000-0000-000000000000" in (
            capsys.readouterr().err
        )
        assert main(["probe", url, *jobs[:4]]) == ExitCode.UNUSABLE
        err = capsys.readouterr().err
        assert "does not know job 00000000-0000-0000-0000-000000000001: pass --second-job" in err
        assert main(["probe", url, *jobs[:6], "--second-fence", "2"]) == ExitCode.UNUSABLE
        assert "--second-fence (2) must be below --fence (2)" in capsys.readouterr().err


# -- faulty destinations (issue 38) -------------------------------------------------------------

Fault = Literal["per-entity-only", "at-least-the-job-token"]


class FaultyDestination:
    """A destination of the fenced-effect protocol with one of the faults seen in review, over
    the lease store's jobs: `per-entity-only` keeps the highest fence accepted per entity and
    refuses a lower one, whichever job presents it (it reads no job); `at-least-the-job-token`
    reads the job's token from PostgreSQL and accepts any fence at or above it. Both make one
    effect per idempotency key, repeated at the accepted fence or above."""

    def __init__(self, dsn: str, fault: Fault) -> None:
        self.dsn, self.fault = dsn, fault
        self.entities: dict[str, int] = {}
        self.accepted: dict[str, int] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                entity = self.path.rsplit("/", 1)[-1]
                fence = int(self.headers["X-Execution-Fence"])
                key, job = self.headers["Idempotency-Key"], self.headers["X-Execution-Job"]
                status, body = outer.decide(entity, key, job, fence)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def decide(self, entity: str, key: str, job: str, fence: int) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if key in self.accepted and fence >= self.accepted[key]:
                return 200, {"status": "repeated", "repeated": True}
            if self.fault == "per-entity-only":
                floor = self.entities.get(entity, 0)
            else:
                with connect(self.dsn) as conn:
                    row = conn.execute(
                        "SELECT fencing_token FROM tool_jobs WHERE id = %s", (job,)
                    ).fetchone()
                if row is None:
                    return 404, {"error": "unknown_job", "field": "X-Execution-Job"}
                floor = row["fencing_token"]
            if fence < floor:
                return 409, {"status": "rejected", "repeated": False}
            self.accepted[key] = fence
            self.entities[entity] = max(fence, self.entities.get(entity, 0))
            return 200, {"status": "accepted", "repeated": False}

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def probe_jobs(dsn: str) -> list[str]:
    """Two running jobs, at tokens 2 and 1, as `splitbrain leases destination` makes them: the
    probe's options naming them."""
    probe_class = job_class("probe", max_attempts=2, lease_s=60)
    with LeaseStore(dsn, [probe_class]) as store:
        first = store.enqueue("probe", "probe:first", {}).id
        store.fail(claimed(store.claim("probe", "w")), {}, retryable=True)
        one = claimed(store.claim("probe", "w"))
        store.enqueue("probe", "probe:second", {})
        two = claimed(store.claim("probe", "w"))
    assert (one.job_id, one.fencing_token, two.fencing_token) == (first, 2, 1)
    return [
        "--job",
        str(one.job_id),
        "--fence",
        "2",
        "--second-job",
        str(two.job_id),
        "--second-fence",
        "1",
    ]


SECOND_JOB = "accepts a second job's own lower fence on the entity"
UNISSUED = "refuses a fence above the job's token (unissued)"


@pytest.mark.parametrize(
    ("fault", "broken"),
    [
        # It trusts any fence as high as the entity's, too: N+1 is accepted.
        ("per-entity-only", [SECOND_JOB, UNISSUED]),
        ("at-least-the-job-token", [UNISSUED]),
    ],
)
def test_probe_fails_a_destination_that_compares_fences_across_jobs_or_trusts_them(
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    capsys: pytest.CaptureFixture[str],
    fault: Fault,
    broken: list[str],
) -> None:
    jobs = probe_jobs(postgres_dsn)
    with FaultyDestination(postgres_dsn, fault) as url:
        assert main(["probe", url, *jobs]) == ExitCode.FAILED
        out = capsys.readouterr().out
        assert out.splitlines()[-1] == (
            f"the destination does NOT enforce the fence: fails {'; '.join(broken)}"
        )
        failed = [line for line in out.splitlines()[1:7] if line.split()[-1] == "NO"]
        assert [any(line.startswith(b) for b in broken) for line in failed] == [True] * len(broken)
        assert main(["probe", url, *jobs, "--format", "json"]) == ExitCode.FAILED
    document = json.loads(capsys.readouterr().out)
    assert [c["guarantee"] for c in document["checks"] if not c["holds"]] == broken
