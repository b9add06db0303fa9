"""`splitbrain probe` against the example destination, served by `splitbrain leases destination`
over a real PostgreSQL (issue 23): exit 0 against the fenced one, 1 against the unfenced one, 2
when it cannot run; it writes only under its key prefix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.cli.main import main
from detector.devstack.process import free_port
from detector.errors import ExitCode


@contextmanager
def destination(dsn: str, *flags: str) -> Iterator[tuple[str, str]]:
    """`splitbrain leases destination` on a free port: its URL and the job it says to probe
    with; stopped by SIGTERM to its PID."""
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
        assert hint[:3] == ["probe", "it:", "splitbrain"] and hint[5] == "--job", hint
        yield hint[4], hint[6]
    finally:
        service.send_signal(signal.SIGTERM)
        _, err = service.communicate(timeout=30)
        assert service.returncode == ExitCode.OK, err


def test_probe_passes_a_fenced_destination_and_writes_only_under_its_prefix(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    with destination(postgres_dsn) as (url, job):
        assert main(["probe", url, "--job", job, "--key-prefix", "p1:"]) == ExitCode.OK
    out, err = capsys.readouterr()
    assert "every key and the entity under the prefix 'p1:'" in err
    assert out.splitlines()[-1] == "the destination enforces the fence"
    assert [line.split()[-1] for line in out.splitlines()[1:5]] == ["yes"] * 4
    rows = db.execute(
        "SELECT entity, idempotency_key, accepted FROM fenced_receipts ORDER BY created_at"
    ).fetchall()
    assert len(rows) == 3  # accepted once (the repeat is its receipt), refused twice
    assert all(
        r["entity"].startswith("p1:") and r["idempotency_key"].startswith("p1:") for r in rows
    )
    assert [r["accepted"] for r in rows] == [True, False, False]


def test_probe_fails_an_unfenced_destination_and_says_which_guarantees_broke(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    with destination(postgres_dsn, "--unfenced", "--name", "legacy") as (url, job):
        code = main(["probe", url, "--job", job, "--format", "json"])
    assert code == ExitCode.FAILED
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "splitbrain.probe/v1" and document["fenced"] is False
    assert [(c["status"], c["holds"]) for c in document["checks"]] == [
        (200, True),
        (200, True),  # the same key and fence: answered from its receipt
        (200, False),  # a lower fence accepted
        (200, False),  # the successor's key under a lower fence: a second effect
    ]


def test_probe_cannot_run_against_nothing_or_an_unknown_job(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", f"http://127.0.0.1:{free_port()}"]) == ExitCode.UNUSABLE
    assert "splitbrain probe: no answer from 127.0.0.1" in capsys.readouterr().err
    with destination(postgres_dsn) as (url, _):
        assert main(["probe", url]) == ExitCode.UNUSABLE
    assert "the destination does not know job 00000000-0000-0000-0000-000000000000" in (
        capsys.readouterr().err
    )
