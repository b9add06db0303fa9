"""`splitbrain leases inspect` against a real PostgreSQL (issue 10, item 6): who owns each
running job, the leases that expired, the per-class counts, the bounds and the exit status.

Each test has a fresh database of the session's server (`postgres_dsn`). A lease that must lapse
is one second long, and the test waits for it on the database's clock (polling `now()`), as the
store decides; a lease that must hold is a minute long, so a slow machine cannot lapse it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.cli.main import main
from detector.errors import ExitCode
from detector.leases import Labels, LeaseStore, Outcome
from detector.leases.inspect import inspect_leases
from tests.integration.leases import claimed, job_class, wait_lapsed

SECRET = "payload-text-that-must-never-be-printed"


# The same classes under two policies: a claim through `short` lapses in a second, through
# `long` it holds for the test. The policy is the store's, so both see the same jobs.
NAMES = ("ocr", "web_search")


@pytest.fixture
def short(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[LeaseStore]:
    with LeaseStore(postgres_dsn, [job_class(n, lease_s=1.0) for n in NAMES]) as s:
        yield s


@pytest.fixture
def long(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[LeaseStore]:
    with LeaseStore(postgres_dsn, [job_class(n, lease_s=60.0) for n in NAMES]) as s:
        yield s


def enqueue(store: LeaseStore, n: int, job_class: str = "ocr") -> UUID:
    labels = Labels(tool_class=job_class, model="m-1", provider="local")
    return store.enqueue(job_class, f"doc:{n}:{job_class}", {"text": SECRET}, labels).id


def inspect_cli(
    capsys: pytest.CaptureFixture[str], dsn: str, *args: str
) -> tuple[int, list[str], str]:
    """The exit status, the lines of standard output and standard error."""
    code = main(["leases", "inspect", "--dsn", dsn, *args])
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    return code, out.splitlines(), err


def inspect_json(
    capsys: pytest.CaptureFixture[str], dsn: str, *args: str
) -> tuple[int, dict[str, Any]]:
    code, lines, err = inspect_cli(capsys, dsn, "--format", "json", *args)
    assert err == ""
    (line,) = lines  # one document, on one line
    doc: dict[str, Any] = json.loads(line)
    return code, doc


def line_of(lines: list[str], job_id: UUID) -> str:
    (line,) = (line for line in lines if str(job_id) in line)
    return line


def by_class(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["job_class"]: c for c in doc["classes"]}


# -- the view ---------------------------------------------------------------------------------


def test_running_jobs_show_their_owner_token_and_attempt(
    postgres_dsn: str,
    long: LeaseStore,
    db: psycopg.Connection[DictRow],
    capsys: pytest.CaptureFixture[str],
) -> None:
    retried, other, done, broken, waiting = (enqueue(long, n) for n in range(5))
    first = claimed(long.claim("ocr", "worker-1"))
    assert long.fail(first, {"code": "http_503"}, retryable=True) is Outcome.REQUEUED
    again = claimed(long.claim("ocr", "worker-2"))  # the oldest again: token 2, attempt 2
    assert (again.job_id, again.fencing_token, again.attempt) == (retried, 2, 2)
    assert claimed(long.claim("ocr", "worker-3")).job_id == other
    ok = claimed(long.claim("ocr", "worker-4"))
    assert long.complete(ok, {"text": SECRET}) is Outcome.SUCCEEDED
    bad = claimed(long.claim("ocr", "worker-5"))
    assert long.fail(bad, {"detail": SECRET}, retryable=False) is Outcome.FAILED
    assert (ok.job_id, bad.job_id) == (done, broken)

    code, lines, err = inspect_cli(capsys, postgres_dsn)
    assert (code, err) == (ExitCode.OK, "")
    assert lines[0].startswith("lease store at ") and lines[0].endswith(
        "(database clock): none expired"
    )
    summary = lines[2]
    assert summary.startswith("ocr: queued 1 (oldest ")
    assert summary.endswith("), running 2, succeeded 1, failed 1")
    header = lines[3]
    assert header.split() == [
        "JOB",
        "OWNER",
        "TOKEN",
        "ATTEMPT",
        "LEASE_LEFT",
        "HEARTBEAT_AGE",
        "TOOL_CLASS",
    ]
    row = line_of(lines, retried)
    assert row.split()[:4] == [str(retried), "worker-2", "2", "2"]
    assert row.split()[-1] == "ocr" and "EXPIRED" not in row
    assert line_of(lines, other).split()[:4] == [str(other), "worker-3", "1", "1"]
    # aligned: each column starts where its header does (TOKEN and ATTEMPT are right-aligned)
    for name, cell in (("OWNER", "worker-2"), ("LEASE_LEFT", row.split()[4])):
        assert row.index(cell) == header.index(name)
    assert row.index(" 2 ") + 2 == header.index("TOKEN") + len("TOKEN")
    assert str(done) not in "\n".join(lines) and str(waiting) not in "\n".join(lines)

    view = inspect_leases(db)
    (ocr,) = view.classes
    assert (ocr.queued, ocr.running, ocr.expired, ocr.succeeded, ocr.failed) == (1, 2, 0, 1, 1)
    assert ocr.oldest_queued_age_s is not None and ocr.oldest_queued_age_s >= 0
    assert [j.job_id for j in ocr.running_jobs] == [retried, other]  # least lease left first
    job = ocr.running_jobs[0]
    assert (job.owner_id, job.fencing_token, job.attempt, job.tool_class) == (
        "worker-2",
        2,
        2,
        "ocr",
    )
    assert 0 < job.lease_remaining_s <= 60 and not job.expired
    assert job.heartbeat_age_s is not None and 0 <= job.heartbeat_age_s < 60
    assert job.lease_remaining_s + job.heartbeat_age_s == pytest.approx(60, abs=0.01)
    assert ocr.running_omitted == 0 and view.expired == 0


def test_an_expired_running_lease_is_flagged_and_exits_1_until_it_is_claimed_again(
    postgres_dsn: str,
    short: LeaseStore,
    long: LeaseStore,
    db: psycopg.Connection[DictRow],
    capsys: pytest.CaptureFixture[str],
) -> None:
    stalled_id, live_id = enqueue(short, 1), enqueue(short, 2)
    stalled = claimed(short.claim("ocr", "worker-1"))
    live = claimed(long.claim("ocr", "worker-2"))
    assert (stalled.job_id, live.job_id) == (stalled_id, live_id)
    wait_lapsed(db, stalled)

    code, lines, _ = inspect_cli(capsys, postgres_dsn)
    assert code == ExitCode.FAILED
    assert lines[0].endswith("(database clock): 1 running lease EXPIRED")
    assert lines[2] == "ocr: queued 0, running 2 (1 EXPIRED), succeeded 0, failed 0"
    flagged, fine = lines[4], lines[5]  # the expired lease first
    assert flagged.split()[:4] == [str(stalled_id), "worker-1", "1", "1"]
    assert flagged.split()[4].startswith("-") and flagged.split()[5] == "EXPIRED"
    assert fine.split()[:2] == [str(live_id), "worker-2"] and "EXPIRED" not in fine

    code, doc = inspect_json(capsys, postgres_dsn)
    assert code == ExitCode.FAILED and doc["expired"] == 1
    stale, current = by_class(doc)["ocr"]["running_jobs"]
    assert (stale["job_id"], stale["expired"]) == (str(stalled_id), True)
    assert stale["lease_remaining_s"] <= 0
    assert (current["job_id"], current["expired"]) == (str(live_id), False)
    assert current["lease_remaining_s"] > 0

    # A worker takes the job over under the next token: nothing is expired any more.
    takeover = claimed(long.claim("ocr", "worker-3"))
    assert (takeover.job_id, takeover.fencing_token) == (stalled_id, 2)
    code, lines, _ = inspect_cli(capsys, postgres_dsn)
    assert code == ExitCode.OK
    assert line_of(lines, stalled_id).split()[1:4] == ["worker-3", "2", "2"]
    assert "EXPIRED" not in "\n".join(lines)


def test_the_json_document_has_the_documented_fields(
    postgres_dsn: str,
    long: LeaseStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    running_id, queued_id = enqueue(long, 1), enqueue(long, 2)
    claimed(long.claim("ocr", "worker-1"))
    code, doc = inspect_json(capsys, postgres_dsn)
    assert code == ExitCode.OK
    assert list(doc) == ["schema", "observed_at", "job_class", "limit", "expired", "classes"]
    assert (doc["schema"], doc["job_class"], doc["limit"], doc["expired"]) == (
        "splitbrain.leases-inspect/v1",
        None,
        50,
        0,
    )
    assert datetime.fromisoformat(doc["observed_at"]).utcoffset() is not None
    (ocr,) = doc["classes"]
    assert list(ocr) == [
        "job_class",
        "queued",
        "running",
        "expired",
        "succeeded",
        "failed",
        "oldest_queued_age_s",
        "running_jobs",
        "running_omitted",
    ]
    assert {k: ocr[k] for k in ("job_class", "queued", "running", "expired")} == {
        "job_class": "ocr",
        "queued": 1,
        "running": 1,
        "expired": 0,
    }
    assert (ocr["succeeded"], ocr["failed"], ocr["running_omitted"]) == (0, 0, 0)
    assert isinstance(ocr["oldest_queued_age_s"], float) and ocr["oldest_queued_age_s"] >= 0
    (job,) = ocr["running_jobs"]
    assert list(job) == [
        "job_id",
        "owner_id",
        "fencing_token",
        "attempt",
        "lease_remaining_s",
        "heartbeat_age_s",
        "expired",
        "tool_class",
    ]
    assert {k: job[k] for k in ("job_id", "owner_id", "fencing_token", "attempt")} == {
        "job_id": str(running_id),
        "owner_id": "worker-1",
        "fencing_token": 1,
        "attempt": 1,
    }
    assert (job["expired"], job["tool_class"]) == (False, "ocr")
    assert 0 < job["lease_remaining_s"] <= 60 and 0 <= job["heartbeat_age_s"] < 60
    assert str(queued_id) not in json.dumps(doc)  # queued jobs are counted, not listed


def test_the_class_filter_shows_one_class_and_its_exit_status(
    postgres_dsn: str,
    short: LeaseStore,
    long: LeaseStore,
    db: psycopg.Connection[DictRow],
    capsys: pytest.CaptureFixture[str],
) -> None:
    enqueue(long, 1, "ocr")
    claimed(long.claim("ocr", "worker-1"))
    enqueue(short, 1, "web_search")
    wait_lapsed(db, claimed(short.claim("web_search", "worker-2")))

    code, doc = inspect_json(capsys, postgres_dsn)
    assert code == ExitCode.FAILED and list(by_class(doc)) == ["ocr", "web_search"]

    code, lines, _ = inspect_cli(capsys, postgres_dsn, "--class", "ocr")
    assert code == ExitCode.OK  # the expired lease is in a class not inspected
    assert "web_search" not in "\n".join(lines) and "worker-2" not in "\n".join(lines)
    assert lines[2] == "ocr: queued 0, running 1, succeeded 0, failed 0"

    code, doc = inspect_json(capsys, postgres_dsn, "--class", "web_search")
    assert code == ExitCode.FAILED and doc["job_class"] == "web_search"
    assert [(c["job_class"], c["expired"]) for c in doc["classes"]] == [("web_search", 1)]

    code, lines, _ = inspect_cli(capsys, postgres_dsn, "--class", "pdf")
    assert code == ExitCode.OK
    assert lines[2:] == ["pdf: queued 0, running 0, succeeded 0, failed 0"]


def test_the_limit_shows_the_expired_and_least_left_first_and_counts_the_rest(
    postgres_dsn: str,
    short: LeaseStore,
    long: LeaseStore,
    db: psycopg.Connection[DictRow],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = [enqueue(short, n) for n in range(4)]
    stalled = claimed(short.claim("ocr", "worker-0"))
    for n in (1, 2, 3):
        claimed(long.claim("ocr", f"worker-{n}"))
    wait_lapsed(db, stalled)

    code, lines, _ = inspect_cli(capsys, postgres_dsn, "--limit", "2")
    assert code == ExitCode.FAILED
    assert [line.split()[0] for line in lines[4:6]] == [str(ids[0]), str(ids[1])]
    assert lines[6:] == [
        "  (2 more running not shown: --limit 2, expired and least lease left first)"
    ]

    code, doc = inspect_json(capsys, postgres_dsn, "--limit", "2")
    ocr = by_class(doc)["ocr"]
    assert (doc["limit"], ocr["running"], ocr["running_omitted"]) == (2, 4, 2)
    assert [j["job_id"] for j in ocr["running_jobs"]] == [str(ids[0]), str(ids[1])]

    code, doc = inspect_json(capsys, postgres_dsn)
    ocr = by_class(doc)["ocr"]
    assert [j["job_id"] for j in ocr["running_jobs"]] == [str(i) for i in ids]
    assert ocr["running_omitted"] == 0

    with pytest.raises(SystemExit) as exit_:
        main(["leases", "inspect", "--dsn", postgres_dsn, "--limit", "0"])
    assert exit_.value.code == ExitCode.UNUSABLE
    assert "--limit: expected a whole number from 1" in capsys.readouterr().err


def test_an_owner_id_is_printed_escaped(
    postgres_dsn: str, long: LeaseStore, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = enqueue(long, 1)
    claimed(long.claim("ocr", "worker\x1b[2J\n-1"))
    code, lines, _ = inspect_cli(capsys, postgres_dsn)
    assert code == ExitCode.OK
    row = line_of(lines, job_id)
    assert row.split()[1] == "worker\\x1b[2J\\n-1"
    assert row.index("worker") == lines[3].index("OWNER")
    assert "\x1b" not in "\n".join(lines)


# -- a database it cannot use -----------------------------------------------------------------


def test_an_unmigrated_database_is_one_line_naming_migrate_and_exit_2(
    empty_postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for fmt in ("text", "json"):
        code, lines, err = inspect_cli(capsys, empty_postgres_dsn, "--format", fmt)
        assert (code, lines) == (ExitCode.UNUSABLE, [])
        assert err.splitlines() == [
            "splitbrain leases inspect: the database has no lease store (no tool_jobs table): "
            "run `splitbrain leases migrate` with the same DSN first"
        ]


def test_a_migrated_empty_store_has_no_jobs_and_exits_0(
    postgres_dsn: str, db: psycopg.Connection[DictRow], capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, err = inspect_cli(capsys, postgres_dsn)
    assert (code, err) == (ExitCode.OK, "")
    assert lines[1:] == ["no jobs"]
    code, doc = inspect_json(capsys, postgres_dsn)
    assert (code, doc["classes"], doc["expired"]) == (ExitCode.OK, [], 0)


def test_the_command_reads_its_variable_and_refuses_a_missing_dsn(
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("SPLITBRAIN_LEASES_DSN", raising=False)
    assert main(["leases", "inspect"]) == ExitCode.UNUSABLE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "splitbrain leases inspect: no database given: pass --dsn or set SPLITBRAIN_LEASES_DSN\n"
    )
    monkeypatch.setenv("SPLITBRAIN_LEASES_DSN", postgres_dsn)
    assert main(["leases", "inspect"]) == ExitCode.OK
    assert capsys.readouterr().out.endswith("no jobs\n")
