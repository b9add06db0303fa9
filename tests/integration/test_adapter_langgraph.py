"""The LangGraph adapter against a real PostgreSQL (LangGraph's PostgresSaver and the thread
ledger in the lease store's schema), a real broker and the detector worker: two runs that
resume one thread at once fork its checkpoint chain, and the findings topic says so, critical,
as `audit` says it for the same events.

Each run is a pod of its own here: a thread with its own saver connection, its own ledger
connection and its own worker id, as two instances of one LangGraph service would be.
"""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from confluent_kafka import IsolationLevel
from psycopg.rows import DictRow

from detector.adapters import AdapterSink
from detector.devstack.topics import TopicReader
from detector.kafka.emit import Emitter
from tests.integration.deployment import Deployment, audited, latest, wait_for

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")

from langgraph.checkpoint.postgres import PostgresSaver

from detector.adapters.langgraph import Child, PostgresThreads, Step, fork_effect_key
from detector.demos.langgraph_graph import PODS, build, fork_on_postgres, thread

THREAD = "support-ticket-8796"


def test_two_runs_forking_a_thread_on_postgres_are_a_critical_finding(
    kafka_deployment: Deployment, postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    worker = kafka_deployment.worker()
    sink = AdapterSink(
        "langgraph",
        publisher=lambda: Emitter(kafka_deployment.config, topic=kafka_deployment.topics.input),
    )
    try:
        out = fork_on_postgres(postgres_dsn, sink, THREAD)
        assert sink.flush(30)
    finally:
        sink.close()
    # Both runs answered with their own note, as if each were the thread's only writer.
    assert out == {pod: ["planned", f"work by {pod}", "replied"] for pod in PODS}

    # LangGraph's own tables: one parent with two children; the thread follows one of them,
    # and the other pod's note is gone without an error anywhere.
    with PostgresSaver.from_conn_string(postgres_dsn) as saver:
        notes = build(saver).get_state(thread(THREAD)).values["notes"]
    assert notes in ([*out[pod]] for pod in PODS)
    rows = db.execute(
        "SELECT parent_checkpoint_id, count(*) AS n FROM checkpoints WHERE thread_id = %s"
        " GROUP BY parent_checkpoint_id HAVING count(*) > 1",
        (THREAD,),
    ).fetchall()
    assert len(rows) == 1 and rows[0]["n"] == 2, rows
    parent = rows[0]["parent_checkpoint_id"]
    (first,) = db.execute(
        "SELECT worker_id FROM langgraph_children WHERE thread_id = %s AND parent_id = %s",
        (THREAD, parent),
    ).fetchall()
    assert first["worker_id"] in {"pod-a", "pod-b"}  # exactly one was first

    with TopicReader(
        kafka_deployment.config,
        kafka_deployment.topics.input,
        isolation=IsolationLevel.READ_UNCOMMITTED,
    ) as events:
        lines = [r.value for r in events.read_to_end()]
    expected = audited(lines)
    assert [f["severity"] for f in expected.values()] == ["critical"]

    with kafka_deployment.reader(kafka_deployment.topics.findings) as findings:

        def as_audit_says() -> bool:
            findings.poll(0.2)
            return latest(findings.records) == expected

        wait_for(as_audit_says, "the worker's findings to equal audit's", workers=[worker])
    (finding,) = expected.values()
    assert finding["workflow_key"] == THREAD
    assert {finding["displaced"]["worker_id"], finding["current"]["worker_id"]} == {
        "pod-a",
        "pod-b",
    }
    duplicate = next(c for c in finding["conditions"] if c["kind"] == "duplicate_effect")
    assert duplicate["cause"] == "failover"
    assert duplicate["effect_key"] == fork_effect_key(parent)
    # The ledger's seq orders the takeover, and the database confirms both children.
    assert finding["ordering"] == "authoritative_seq"
    assert finding["confidence"] == "high"


def test_one_batch_of_ledger_steps_keeps_every_step_in_order(postgres_dsn: str) -> None:
    """Two runs begun in one batch, each child under its own run's epoch, a fork found inside
    the batch, and a release's tick: the same answers as one call per step."""
    threads = PostgresThreads(postgres_dsn)
    threads.setup()
    try:
        before, seq = threads.begin("batch", "")
        done = threads.steps(
            [
                Step("batch", "", True, None, "c1", "pod-a"),  # run A begins with c1
                Step("batch", "", False, "c1", "c2", "pod-a", run=0),  # A's next
                Step("batch", "", True, "c1", "c3", "pod-b"),  # run B forks c1
                Step("batch", ""),  # a release
            ]
        )
    finally:
        threads.close()
    a, b = done[0].epoch, done[2].epoch
    assert a == before + 1 and b == before + 2
    seqs = [done[0].begun_seq, done[0].seq, done[1].seq, done[2].begun_seq, done[2].seq]
    assert seq is not None and [*seqs, done[3].seq] == [seq + i for i in range(1, 7)]
    assert (done[0].first, done[1].first) == (None, None)
    assert done[2].first == Child("c2", a, "pod-a", done[1].seq)  # the second writer learns it


def test_the_ledger_setup_creates_its_own_tables_and_nothing_of_the_job_queue(
    empty_postgres_dsn: str,
) -> None:
    """A LangGraph app's database (an empty one) gets the ledger alone (`setup()` or `leases migrate
    --langgraph`); the full `leases migrate` adds the job queue's beside it later, and the
    ledger's setup then changes nothing."""

    def tables() -> set[str]:
        with psycopg.connect(empty_postgres_dsn) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        return {row[0] for row in rows}

    ledger = PostgresThreads(empty_postgres_dsn)
    try:
        ledger.setup()
        assert tables() == {"splitbrain_migrations", "langgraph_threads", "langgraph_children"}
        assert ledger.begin("t", "")[0] == 1  # its function is there

        cli = [
            sys.executable,
            "-m",
            "detector.cli",
            "leases",
            "migrate",
            "--dsn",
            empty_postgres_dsn,
        ]
        same = subprocess.run([*cli, "--langgraph"], capture_output=True, text=True, check=True)
        assert same.stdout == "schema at version 6: already current, nothing changed\n"
        full = subprocess.run(cli, capture_output=True, text=True, check=True)
        assert [line.split(":")[0] for line in full.stdout.splitlines()] == [
            *(f"applied migration {n}" for n in (1, 2, 3, 4, 7)),
            "schema at version 7",
        ]
        assert {"tool_jobs", "tool_job_outbox", "fenced_receipts"} <= tables()
        ledger.setup()
        assert ledger.begin("t", "")[0] == 2
    finally:
        ledger.close()
