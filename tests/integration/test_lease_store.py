"""The fenced lease store against a real PostgreSQL (issue 10, part 1): exclusive claims, fenced
writes, the outbox in each transition's transaction, migrations, and a server restart mid-run.

Each test has a fresh database of the session's server (`postgres_dsn`). Leases are one second
long, so a lapse is a short sleep, measured on the database's clock as the store's leases are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from uuid import UUID

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import DictRow

from detector.cli.leases import DEFAULT_JOB_RETENTION_H
from detector.cli.main import main
from detector.contracts.events import Kind, Source, parse_event_obj
from detector.devstack.postgres import LocalPostgres
from detector.devstack.process import free_port
from detector.errors import ExitCode
from detector.histories.audit import audit_lines
from detector.leases import (
    FailureReason,
    JobKeyConflictError,
    JobState,
    Labels,
    Lease,
    LeaseInputError,
    LeaseLost,
    LeaseStore,
    Outcome,
    Pruned,
    Stage,
    StoreUnavailableError,
    migrate,
)
from detector.leases.db import connect
from detector.leases.retention import DEFAULT_JOB_RETENTION
from tests.integration.deployment import wait_for
from tests.integration.leases import claimed, job_class, outbox, wait_lapsed

CLASSES = (job_class(), job_class("once", max_attempts=1))
LABELS = Labels(tool_class="ocr", model="tesseract-5", provider="local")


@pytest.fixture
def store(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[LeaseStore]:
    with LeaseStore(postgres_dsn, CLASSES) as s:
        yield s


# -- claims ---------------------------------------------------------------------------------


def test_each_job_is_claimed_once_by_concurrent_claimers(
    postgres_dsn: str, store: LeaseStore
) -> None:
    jobs = {store.enqueue("ocr", f"doc:{i}:ocr", {"doc": i}).id for i in range(60)}
    start = threading.Barrier(8)
    taken: list[Lease] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        with LeaseStore(postgres_dsn, CLASSES) as own:
            start.wait()
            while (lease := own.claim("ocr", f"w{n}")) is not None:
                with lock:
                    taken.append(lease)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(lease.job_id for lease in taken) == sorted(jobs)
    assert {(lease.fencing_token, lease.attempt) for lease in taken} == {(1, 1)}
    assert len({lease.owner_id for lease in taken}) > 1  # they did compete


def test_a_lapsed_lease_is_claimed_again_under_a_higher_token(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    job = store.enqueue("ocr", "doc:1:ocr", {"doc": 1}, LABELS)
    first = claimed(store.claim("ocr", "w1"))
    assert (first.job_id, first.fencing_token, first.attempt) == (job.id, 1, 1)
    assert first.payload == {"doc": 1} and first.labels == LABELS
    assert store.claim("ocr", "w2") is None  # the lease holds
    wait_lapsed(db, first)
    second = claimed(store.claim("ocr", "w2"))
    assert (second.job_id, second.fencing_token, second.attempt) == (job.id, 2, 2)
    assert second.lease_until > first.lease_until


def test_a_claim_takes_its_lease_from_the_class_and_the_database_clock(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {})
    lease = claimed(store.claim("ocr", "w1"))
    row = db.execute(
        "SELECT lease_until - heartbeat_at AS length FROM tool_jobs WHERE id = %s",
        (lease.job_id,),
    ).fetchone()
    assert row is not None and row["length"].total_seconds() == job_class().lease_s


# -- fenced writes ----------------------------------------------------------------------------


def test_a_displaced_owner_learns_it_lost_the_lease_and_cannot_write(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {"doc": 1})
    zombie = claimed(store.claim("ocr", "w1"))
    wait_lapsed(db, zombie)
    owner = claimed(store.claim("ocr", "w2"))

    assert store.extend(zombie) == LeaseLost(zombie.job_id, 1)
    assert store.complete(zombie, {"text": "late"}) is Outcome.REJECTED
    assert store.fail(zombie, {"code": "timeout"}, retryable=True) is Outcome.REJECTED
    job = store.job(zombie.job_id)
    assert job is not None
    assert (job.state, job.owner_id, job.fencing_token) == (JobState.RUNNING, "w2", 2)
    assert job.result is None and job.error is None

    extended = store.extend(owner)
    assert isinstance(extended, Lease) and extended.lease_until >= owner.lease_until
    assert store.complete(extended, {"text": "ok"}) is Outcome.SUCCEEDED
    done = store.job(owner.job_id)
    assert done is not None
    assert (done.state, done.result) == (JobState.SUCCEEDED, {"text": "ok"})


def test_an_expired_lease_refuses_its_owner_even_before_anyone_takes_over(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {})
    lease = claimed(store.claim("ocr", "w1"))
    wait_lapsed(db, lease)
    assert store.complete(lease, {"text": "too late"}) is Outcome.REJECTED
    assert isinstance(store.extend(lease), LeaseLost)
    job = store.job(lease.job_id)
    assert job is not None and job.state is JobState.RUNNING and job.result is None


def test_an_extension_that_reaches_the_row_after_its_lease_ran_out_is_refused(
    postgres_dsn: str, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """The extension's transaction begins while the lease holds, and its UPDATE waits for the
    row's lock until the lease has run out: the check is the database's time when the row is
    checked (`clock_timestamp()`), not its transaction's start (`now()`), so it is refused."""
    store.enqueue("ocr", "doc:1:ocr", {})
    lease = claimed(store.claim("ocr", "w1"))
    answers: list[Lease | LeaseLost] = []
    with connect(postgres_dsn) as blocker:
        with blocker.transaction():
            blocker.execute(
                "UPDATE tool_jobs SET updated_at = updated_at WHERE id = %s", (lease.job_id,)
            )
            extend = threading.Thread(target=lambda: answers.append(store.extend(lease)))
            extend.start()
            deadline = time.monotonic() + 10
            while not db.execute(
                "SELECT count(*) > 0 AS waiting FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()["waiting"]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the extension never waited for the lock"
                time.sleep(0.01)
            wait_lapsed(db, lease)
        extend.join(10)
    assert len(answers) == 1 and isinstance(answers[0], LeaseLost)
    assert outbox(db, lease.job_id)[-1]["kind"] == "heartbeat_lost"


def test_a_failed_attempt_is_retried_until_the_class_allows_no_more(store: LeaseStore) -> None:
    job = store.enqueue("ocr", "doc:1:ocr", {})
    for attempt in (1, 2):
        lease = claimed(store.claim("ocr", "w1"))
        assert lease.attempt == attempt
        assert store.fail(lease, {"code": "http_503"}, retryable=True) is Outcome.REQUEUED
        requeued = store.job(job.id)
        assert requeued is not None and requeued.state is JobState.QUEUED
    last = claimed(store.claim("ocr", "w1"))
    assert store.fail(last, {"code": "http_503"}, retryable=True) is Outcome.FAILED
    failed = store.job(job.id)
    assert failed is not None and failed.state is JobState.FAILED
    assert failed.error == {
        "reason": FailureReason.ATTEMPTS_EXHAUSTED,
        "attempt": 3,
        "error": {"code": "http_503"},
    }
    assert store.claim("ocr", "w1") is None


def test_an_error_that_is_not_retryable_fails_the_job_at_once(store: LeaseStore) -> None:
    job = store.enqueue("ocr", "doc:1:ocr", {})
    lease = claimed(store.claim("ocr", "w1"))
    assert store.fail(lease, {"code": "bad_document"}, retryable=False) is Outcome.FAILED
    failed = store.job(job.id)
    assert failed is not None and failed.state is JobState.FAILED
    assert failed.error["reason"] == FailureReason.NOT_RETRYABLE


def test_a_last_attempt_that_never_answered_fails_for_good(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    job = store.enqueue("once", "doc:1:once", {})
    lease = claimed(store.claim("once", "w1"))
    wait_lapsed(db, lease)
    assert store.claim("once", "w2") is None
    failed = store.job(job.id)
    assert failed is not None and failed.state is JobState.FAILED
    assert failed.error["reason"] == FailureReason.ATTEMPTS_EXHAUSTED
    assert failed.error["error"] == {"code": "lease_expired"}
    last = outbox(db, job.id)[-1]
    assert (last["kind"], last["source"], last["fencing_token"]) == (
        "lease_released",
        "coordinator",
        1,
    )


# -- the outbox -------------------------------------------------------------------------------


def test_the_outbox_has_each_transition_in_order_and_a_zombie_after_its_takeover(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """DESIGN §3-§4: `seq` is the job's authoritative order, so what the displaced owner does
    after the takeover must carry a higher seq than the takeover, whatever it believes."""
    job = store.enqueue("ocr", "doc:1:ocr", {"doc": 1}, LABELS)
    zombie = claimed(store.claim("ocr", "w1"))
    store.extend(zombie)
    wait_lapsed(db, zombie)
    owner = claimed(store.claim("ocr", "w2"))
    store.extend(zombie)
    store.complete(zombie, {"text": "late"})
    store.extend(owner)
    store.complete(owner, {"text": "ok"})

    events = outbox(db, job.id)
    assert [(e["kind"], e["fencing_token"], e["owner_id"]) for e in events] == [
        ("job_claimed", 1, "w1"),
        ("heartbeat_ok", 1, "w1"),
        ("job_claimed", 2, "w2"),
        ("heartbeat_lost", 1, "w1"),
        ("result_rejected", 1, "w1"),
        ("heartbeat_ok", 2, "w2"),
        ("lease_released", 2, "w2"),
    ]
    parsed = [parse_event_obj(e) for e in events]
    assert [p.kind for p in parsed] == [
        Kind.LEASE_ACQUIRED,
        Kind.HEARTBEAT,
        Kind.LEASE_ACQUIRED,
        Kind.LEASE_LOST,
        Kind.EFFECT_REJECTED,
        Kind.HEARTBEAT,
        Kind.LEASE_RELEASED,
    ]
    for seq, (raw, event) in enumerate(zip(events, parsed, strict=True), start=1):
        assert event.dropped_fields == ()
        assert (event.workflow_key, event.seq) == (str(job.id), seq)
        assert event.event_id == f"{job.id}:{seq}"
        assert event.attrs == {"tool_class": "ocr", "model": "tesseract-5", "provider": "local"}
        assert event.observed_at is not None
        assert raw["detail"]["job_class"] == "ocr"
    takeover = parsed[2]
    assert takeover.source is Source.COORDINATOR
    assert (takeover.lease_duration_s, takeover.heartbeat_interval_s) == (1.0, 0.2)
    assert takeover.lease_until == owner.lease_until
    rejected = parsed[4]
    assert (rejected.source, rejected.effect_key, rejected.destination) == (
        Source.DESTINATION,
        "result",
        "tool_jobs",
    )
    # The displaced owner's lost heartbeat and refused result come after the takeover.
    assert (takeover.seq, parsed[3].seq, parsed[4].seq) == (3, 4, 5)


def test_a_refused_write_on_an_unknown_job_records_nothing(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {})
    real = claimed(store.claim("ocr", "w1"))
    ghost = Lease(
        job_id=UUID(int=1),
        job_class="ocr",
        owner_id="w1",
        fencing_token=1,
        attempt=1,
        lease_until=real.lease_until,
        idempotency_key="ghost",
        payload={},
        labels=Labels(),
    )
    assert isinstance(store.extend(ghost), LeaseLost)
    assert store.complete(ghost, {}) is Outcome.REJECTED
    row = db.execute("SELECT count(*) AS n FROM tool_job_outbox").fetchone()
    assert row is not None and row["n"] == 1  # the real claim only


# -- bad input --------------------------------------------------------------------------------


def test_bad_input_is_refused_naming_the_field(postgres_dsn: str, store: LeaseStore) -> None:
    with pytest.raises(LeaseInputError, match=r"job_class: unknown job class 'pdf' \(known: "):
        store.enqueue("pdf", "doc:1:pdf", {})
    with pytest.raises(LeaseInputError, match="job_class: unknown job class 'pdf'"):
        store.claim("pdf", "w1")
    with pytest.raises(LeaseInputError, match="idempotency_key: expected a string of 1 to 512"):
        store.enqueue("ocr", "", {})
    with pytest.raises(LeaseInputError, match="owner_id: expected a string of 1 to 256"):
        store.claim("ocr", "w" * 257)
    with pytest.raises(LeaseInputError, match="payload: not JSON"):
        store.enqueue("ocr", "doc:1:ocr", {"at": object()})
    with pytest.raises(LeaseInputError, match="job_class: 'ocr' is defined twice"):
        LeaseStore(postgres_dsn, [job_class(), job_class()])

    with LeaseStore(postgres_dsn, CLASSES, max_payload_bytes=1024) as small:
        with pytest.raises(
            LeaseInputError, match=r"payload: 1032 bytes as JSON; the limit is 1024"
        ):
            small.enqueue("ocr", "doc:1:ocr", {"text": "x" * 1021})
        small.enqueue("ocr", "doc:1:ocr", {"text": "x" * 1011})
        lease = claimed(small.claim("ocr", "w1"))
        with pytest.raises(LeaseInputError, match="result: 2032 bytes as JSON"):
            small.complete(lease, {"text": "x" * 2021})
        job = small.job(lease.job_id)
        assert job is not None and job.state is JobState.RUNNING


def test_a_transition_whose_event_would_be_invalid_raises_naming_the_field_and_writes_nothing(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """The outbox takes only what the input contract accepts (DESIGN §3: a destination is a
    string of at most 256 characters): checked when the row is written, not at relay time."""
    store.enqueue("ocr", "doc:1:ocr", {})
    lease = claimed(store.claim("ocr", "w1"))
    with pytest.raises(
        LeaseInputError,
        match="destination: the tool_request_started event would not be valid: String should "
        "have at most 256 characters",
    ):
        store.request_started(lease, request_id="req-1", destination="d" * 257)
    assert [e["kind"] for e in outbox(db, lease.job_id)] == ["job_claimed"]
    assert store.request_started(lease, request_id="req-1", destination="d" * 256) == lease
    assert [e["kind"] for e in outbox(db, lease.job_id)] == ["job_claimed", "tool_request_started"]


def test_a_repeated_idempotency_key_returns_the_existing_job_if_it_is_the_same_operation(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    first = store.enqueue("ocr", "invoice:7:ocr", {"page": 1, "lang": "en"}, LABELS)
    again = store.enqueue("ocr", "invoice:7:ocr", {"lang": "en", "page": 1})  # the same JSON
    assert again == first
    # Another payload or another class under the key is another operation: an error, not a
    # silent return of the other job.
    with pytest.raises(JobKeyConflictError, match="idempotency_key: already names job") as e:
        store.enqueue("ocr", "invoice:7:ocr", {"page": 2})
    assert e.value.existing == first
    with pytest.raises(JobKeyConflictError, match="class 'once'"):
        store.enqueue("once", "invoice:7:ocr", {"page": 1, "lang": "en"})
    row = db.execute("SELECT count(*) AS n FROM tool_jobs").fetchone()
    assert row is not None and row["n"] == 1


# -- retries, cancel, retention, stages ---------------------------------------------------------


def test_a_retry_waits_its_backoff_with_jitter_before_it_can_be_claimed(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    """A provider outage must not burn every attempt in milliseconds: a requeued job is not
    claimable before its `not_before`, which grows with the attempt, capped, and jittered."""
    slow = job_class("slow", retry_backoff_s=60, retry_backoff_max_s=100, max_attempts=5)
    with LeaseStore(postgres_dsn, [slow]) as s:
        job = s.enqueue("slow", "doc:1:ocr", {})
        lease = claimed(s.claim("slow", "w1"))
        assert s.fail(lease, {"code": "http_503"}, retryable=True) is Outcome.REQUEUED
        assert s.claim("slow", "w2") is None  # queued, but not before its backoff
        waiting = s.job(job.id)
        assert waiting is not None and waiting.state is JobState.QUEUED
        assert waiting.not_before is not None
        wait_s = (waiting.not_before - waiting.updated_at).total_seconds()
        assert 30 <= wait_s <= 60  # half of 60 fixed, half drawn
        released = outbox(db, job.id)[-1]
        assert released["detail"]["retry_in_s"] == pytest.approx(wait_s, abs=0.01)
        # Its backoff over (moved here, rather than waited for), it is claimed again.
        db.execute("UPDATE tool_jobs SET not_before = now() WHERE id = %s", (job.id,))
        again = claimed(s.claim("slow", "w2"))
        assert again.attempt == 2
    # The waits: doubling from the base, capped at the maximum, each between half and all.
    assert [slow.retry_delay_s(a, 0.0) for a in (1, 2, 3)] == [30, 50, 50]
    assert [slow.retry_delay_s(a, 1.0) for a in (1, 2, 3)] == [60, 100, 100]


def test_cancel_fences_the_running_owner_and_orders_its_later_effects_after_it(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {}, LABELS)
    lease = claimed(store.claim("ocr", "w1"))
    done = store.cancel(lease.job_id, by="ops-oncall")
    assert done is not None and done.state is JobState.CANCELLED
    assert (done.fencing_token, done.owner_id, done.lease_until) == (2, "ops-oncall", None)
    assert store.cancel(lease.job_id) is None  # finished: nothing to cancel
    # The running owner is told it lost, why, and cannot write its result.
    assert isinstance(store.extend(lease), LeaseLost)
    assert store.complete(lease, {"text": "late"}) is Outcome.REJECTED
    assert store.claim("ocr", "w2") is None
    events = outbox(db, lease.job_id)
    assert [(e["kind"], e["fencing_token"], e["source"]) for e in events] == [
        ("job_claimed", 1, "coordinator"),
        ("job_claimed", 2, "coordinator"),
        ("lease_released", 2, "coordinator"),
        ("heartbeat_lost", 1, "worker"),
        ("result_rejected", 1, "destination"),
    ]
    assert events[1]["detail"]["outcome"] == "cancelled"
    assert events[1]["detail"]["cancelled_state"] == "running"
    assert (events[3]["detail"]["reason"], events[3]["detail"]["refused"]) == (
        "cancelled",
        "extend",
    )
    # The detector sees the displaced owner's refused result after the cancel: fenced.
    result = audit_lines(json.dumps(e).encode() for e in events)
    displaced = [f.displaced for f in result.findings.values()]
    assert [d.owner_epoch if d else None for d in displaced] == [1]


def test_heartbeat_lost_says_why_and_a_refused_request_start_is_its_own_event(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {})
    w1 = claimed(store.claim("ocr", "w1"))
    wait_lapsed(db, w1)
    assert isinstance(store.request_started(w1, request_id="req-1"), LeaseLost)
    assert isinstance(store.extend(w1), LeaseLost)
    w2 = claimed(store.claim("ocr", "w2"))
    assert isinstance(store.extend(w1), LeaseLost)
    assert store.complete(w2, {}) is Outcome.SUCCEEDED
    assert isinstance(store.extend(w2), LeaseLost)
    lost = [
        (
            e["fencing_token"],
            e["detail"]["refused"],
            e["detail"]["reason"],
            e["detail"].get("request"),
        )
        for e in outbox(db, w1.job_id)
        if e["kind"] == "heartbeat_lost"
    ]
    assert lost == [
        (1, "request_start", "expired", "req-1"),
        (1, "extend", "expired", None),
        (1, "extend", "taken_over", None),
        (2, "extend", "finished", None),
    ]


def test_prune_deletes_finished_relayed_jobs_older_than_the_horizon_and_nothing_else(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    old_done = store.enqueue("ocr", "doc:1:ocr", {}).id
    store.complete(claimed(store.claim("ocr", "w1")), {})
    old_unrelayed = store.enqueue("ocr", "doc:2:ocr", {}).id
    store.complete(claimed(store.claim("ocr", "w1")), {})
    old_running = store.enqueue("ocr", "doc:3:ocr", {}).id
    claimed(store.claim("ocr", "w1"))
    new_done = store.enqueue("ocr", "doc:4:ocr", {}).id
    store.complete(claimed(store.claim("ocr", "w1")), {})
    db.execute(
        "UPDATE tool_job_outbox SET relayed_at = now() - interval '2 days' WHERE job_id <> %s",
        (old_unrelayed,),
    )
    db.execute("UPDATE tool_job_outbox SET relayed_at = now() WHERE job_id = %s", (new_done,))
    db.execute(
        "UPDATE tool_jobs SET updated_at = now() - interval '2 days' WHERE id <> %s", (new_done,)
    )
    pruned = store.prune(timedelta(days=1))
    left = {r["id"] for r in db.execute("SELECT id FROM tool_jobs").fetchall()}
    assert left == {old_unrelayed, old_running, new_done}
    assert pruned.jobs == 1
    # The relayed rows that old went too (the running job's claim), not the newer ones.
    rows = db.execute(
        "SELECT job_id, relayed_at IS NULL AS pending FROM tool_job_outbox"
    ).fetchall()
    assert {r["job_id"] for r in rows} == {old_unrelayed, new_done}
    assert pruned.outbox_rows == 2 + 1
    assert store.prune(timedelta(days=1)) == Pruned(0, 0, 0)
    # A pruned job's key is free again: the retention is the idempotency window.
    assert store.enqueue("ocr", "doc:1:ocr", {"again": True}).id != old_done


def test_a_stage_completes_and_enqueues_the_next_in_one_transaction(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "report:9:extract", {"page": 1})
    stage1 = claimed(store.claim("ocr", "w1"))
    taken = store.enqueue("ocr", "report:9:render", {"other": True})
    # The next stage's key names another operation: the completion is refused as a whole.
    with pytest.raises(JobKeyConflictError):
        store.complete(stage1, {"rows": 3}, then=Stage("ocr", "report:9:render", {"rows": 3}))
    still = store.job(stage1.job_id)
    assert still is not None and still.state is JobState.RUNNING
    db.execute("DELETE FROM tool_jobs WHERE id = %s", (taken.id,))
    outcome = store.complete(
        stage1, {"rows": 3}, then=Stage("once", "report:9:render", {"rows": 3}, LABELS)
    )
    assert outcome is Outcome.SUCCEEDED
    stage2 = claimed(store.claim("once", "w2"))
    assert (stage2.idempotency_key, stage2.payload, stage2.labels) == (
        "report:9:render",
        {"rows": 3},
        LABELS,
    )
    # A stage whose lease is gone enqueues nothing.
    wait_lapsed(db, stage2)
    assert store.complete(stage2, {}, then=Stage("ocr", "report:9:mail", {})) is Outcome.REJECTED
    assert db.execute(
        "SELECT count(*) AS n FROM tool_jobs WHERE idempotency_key = 'report:9:mail'"
    ).fetchone() == {"n": 0}


# -- migrations and the command ---------------------------------------------------------------


def test_migrate_twice_changes_nothing(empty_postgres_dsn: str) -> None:
    with connect(empty_postgres_dsn) as conn:
        first = migrate(conn)
        recorded = conn.execute("SELECT * FROM splitbrain_migrations").fetchall()
        second = migrate(conn)
        assert [m.version for m in first.applied] == [1, 2, 3, 4, 5, 6, 7]
        assert (second.applied, second.version) == ((), 7)
        assert conn.execute("SELECT * FROM splitbrain_migrations").fetchall() == recorded


def migrate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SPLITBRAIN_")}
    return subprocess.run(
        [sys.executable, "-m", "detector.cli", "leases", "migrate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_migrate_command_is_idempotent_and_refuses_a_bad_dsn(empty_postgres_dsn: str) -> None:
    first = migrate_cli("--dsn", empty_postgres_dsn)
    assert (first.returncode, first.stderr) == (0, "")
    assert first.stdout.splitlines() == [
        "applied migration 1: tool_jobs and tool_job_outbox",
        "applied migration 2: fenced destination",
        "applied migration 3: indexes for relay pruning and claim reaping",
        "applied migration 4: retry backoff, cancel and retention",
        "applied migration 5: langgraph threads: epochs, seq and first children",
        "applied migration 6: langgraph ledger steps in batches",
        "applied migration 7: job priorities and gauge labels",
        "schema at version 7",
    ]
    second = migrate_cli("--dsn", empty_postgres_dsn)
    assert (second.returncode, second.stdout) == (
        0,
        "schema at version 7: already current, nothing changed\n",
    )

    bad = migrate_cli("--dsn", "not a dsn")
    assert bad.returncode == ExitCode.UNUSABLE and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "splitbrain leases migrate: --leases-dsn='not a dsn': expected a libpq connection "
        "string (host=H port=P dbname=D, or postgresql://H:P/D)"
    ]


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        ([], None, "no database given: pass --dsn or set SPLITBRAIN_LEASES_DSN"),
        ([], "", "SPLITBRAIN_LEASES_DSN='': expected a libpq connection string"),
        (
            ["--dsn", "postgresql://alice:hunter2@127.0.0.1/x"],
            None,
            "--dsn holds a password, which ps and shell history keep",
        ),
        (["--dsn", "host=127.0.0.1 port={port} connect_timeout=5"], None, "cannot connect"),
    ],
)
def test_the_migrate_command_says_why_it_cannot_run_in_one_line(
    argv: list[str],
    env: str | None,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if env is None:
        monkeypatch.delenv("SPLITBRAIN_LEASES_DSN", raising=False)
    else:
        monkeypatch.setenv("SPLITBRAIN_LEASES_DSN", env)
    port = str(free_port())  # nothing listens there
    assert main(["leases", "migrate", *(a.replace("{port}", port) for a in argv)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("splitbrain leases migrate: ") and said in line
    assert "hunter2" not in err


def test_the_migrate_command_reads_its_variable(
    empty_postgres_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPLITBRAIN_LEASES_DSN", empty_postgres_dsn)
    assert main(["leases", "migrate"]) == 0
    assert capsys.readouterr().out.endswith("schema at version 7\n")


# -- a restart mid-run ------------------------------------------------------------------------


class Traffic(threading.Thread):
    """Jobs enqueued, claimed, extended and completed one after another until stopped, through
    an outage: what the store acknowledged, and how often it was unavailable."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.stop = threading.Event()
        self.enqueued: list[UUID] = []
        self.succeeded: list[UUID] = []
        self.unavailable = 0
        self.crashed: list[BaseException] = []

    def run(self) -> None:
        try:
            with LeaseStore(self.dsn, CLASSES) as store:
                n = 0
                while not self.stop.is_set():
                    n += 1
                    try:
                        self.one_job(store, n)
                    except StoreUnavailableError:
                        self.unavailable += 1
                        time.sleep(0.05)
        except BaseException as exc:
            self.crashed.append(exc)

    def goes_on(self, when: str) -> None:
        """Until ten more jobs succeeded than now, or the thread crashed."""
        now = len(self.succeeded)
        wait_for(
            lambda: len(self.succeeded) >= now + 10 or bool(self.crashed),
            f"ten jobs to succeed {when}",
        )
        assert self.crashed == []

    def one_job(self, store: LeaseStore, n: int) -> None:
        self.enqueued.append(store.enqueue("ocr", f"doc:{n}:ocr", {"doc": n}).id)
        lease = store.claim("ocr", "w1")
        if lease is not None:
            extended = store.extend(lease)
            done = isinstance(extended, Lease) and store.complete(extended, {"n": n})
            if done is Outcome.SUCCEEDED:
                self.succeeded.append(lease.job_id)


def test_a_database_restart_mid_run_loses_no_job_and_no_outbox_row(
    postgres: LocalPostgres, postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    """Transitions run on while the server crashes and restarts: every call the store
    acknowledged is there afterwards, and every job's outbox is exactly seq 1..n."""
    traffic = Traffic(postgres_dsn)
    traffic.start()
    try:
        traffic.goes_on("before the crash")
        before = db.execute("SELECT job_id, seq, event FROM tool_job_outbox").fetchall()
        assert before
        postgres.restart(crash=True)
        traffic.goes_on("after the crash")
        postgres.restart()
        traffic.goes_on("after the restart")
    finally:
        traffic.stop.set()
        traffic.join()

    assert traffic.crashed == [] and traffic.unavailable > 0
    with connect(postgres_dsn) as conn:
        jobs = {r["id"]: r for r in conn.execute("SELECT id, state, event_seq FROM tool_jobs")}
        rows = conn.execute("SELECT job_id, seq, event FROM tool_job_outbox").fetchall()
    assert set(traffic.enqueued) <= set(jobs)
    assert all(jobs[job_id]["state"] == JobState.SUCCEEDED for job_id in traffic.succeeded)
    events = {(r["job_id"], r["seq"]): r["event"] for r in rows}
    assert all(events.get((r["job_id"], r["seq"])) == r["event"] for r in before)
    seqs: dict[UUID, list[int]] = {}
    for job_id, seq in events:
        seqs.setdefault(job_id, []).append(seq)
    for job_id, job in jobs.items():
        assert sorted(seqs.get(job_id, [])) == list(range(1, job["event_seq"] + 1))
    for event in events.values():
        parse_event_obj(event)


@pytest.mark.parametrize(
    ("options", "statement_timeout", "search_path"),
    [
        ("-c search_path=public", "10s", "public"),
        ("-c statement_timeout=5000 -csearch_path=public", "5s", "public"),
        ("--statement-timeout=3000", "3s", '"$user", public'),
    ],
)
def test_a_dsn_with_its_own_options_keeps_the_server_side_timeouts(
    postgres_dsn: str, options: str, statement_timeout: str, search_path: str
) -> None:
    """A DSN's `options` used to replace the store's, silently dropping the statement and idle
    timeouts: they are merged, and a timeout the DSN sets itself wins."""
    dsn = make_conninfo(postgres_dsn, options=options)
    with connect(dsn) as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[name]  # type: ignore[index]
            for name in ("statement_timeout", "idle_in_transaction_session_timeout", "search_path")
        }
    assert shown == {
        "statement_timeout": statement_timeout,
        "idle_in_transaction_session_timeout": "1min",
        "search_path": search_path,
    }


def test_the_cancel_and_prune_commands(
    postgres_dsn: str,
    store: LeaseStore,
    db: psycopg.Connection[DictRow],
    capsys: pytest.CaptureFixture[str],
) -> None:
    store.enqueue("ocr", "doc:1:ocr", {})
    lease = claimed(store.claim("ocr", "w1"))
    leases = ["leases", "cancel", "--dsn", postgres_dsn]
    assert main([*leases, str(lease.job_id), "--by", "ops"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith(f"cancelled job {lease.job_id} (token now 2, held by ops)")
    assert isinstance(store.extend(lease), LeaseLost)
    assert main([*leases, str(lease.job_id)]) == ExitCode.FAILED
    assert capsys.readouterr().err == (
        f"splitbrain leases cancel: {lease.job_id} not cancelled: it is cancelled\n"
    )
    with pytest.raises(SystemExit) as bad:
        main([*leases, "not-a-uuid"])
    assert bad.value.code == ExitCode.UNUSABLE
    assert "expected a job id (a UUID), got 'not-a-uuid'" in capsys.readouterr().err

    db.execute("UPDATE tool_job_outbox SET relayed_at = now() - interval '3 hours'")
    db.execute("UPDATE tool_jobs SET updated_at = now() - interval '3 hours'")
    prune = ["leases", "prune", "--dsn", postgres_dsn, "--older-than"]
    assert main([*prune, "4"]) == ExitCode.OK
    assert capsys.readouterr().out == (
        "pruned 0 finished jobs, 0 outbox rows and 0 destination receipts older than 4h\n"
    )
    assert main([*prune, "2"]) == ExitCode.OK
    assert capsys.readouterr().out == (
        "pruned 1 finished job, 4 outbox rows and 0 destination receipts older than 2h\n"
    )
    assert store.job(lease.job_id) is None


def test_the_relay_s_default_job_retention_is_the_library_s() -> None:
    assert DEFAULT_JOB_RETENTION.total_seconds() == DEFAULT_JOB_RETENTION_H * 3600
