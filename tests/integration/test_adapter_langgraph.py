"""The LangGraph adapter against a real PostgreSQL (LangGraph's PostgresSaver and the thread
ledger in the lease store's schema), a real broker and the detector worker: two runs that
resume one thread at once fork its checkpoint chain, and the findings topic says so, critical,
as `audit` says it for the same events.

Each run is a "process" of its own here: a thread with its own saver connection, its own ledger
connection and its own worker id, as two pods of one LangGraph service would be.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import IsolationLevel
from psycopg.rows import DictRow

from detector.adapters import AdapterSink
from detector.kafka.emit import Emitter
from detector.testing.kafka import LocalKafka
from detector.testing.topics import TopicReader
from tests.integration.conftest import deploy
from tests.integration.deployment import Deployment, audited, latest, wait_for

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph.state import CompiledStateGraph

from detector.adapters.langgraph import (
    PostgresThreads,
    SplitbrainCheckpointer,
    fork_effect_key,
)
from detector.testing.langgraph_graph import build, thread

THREAD = "support-ticket-8796"
Graph = CompiledStateGraph[Any, Any, Any, Any]


@pytest.fixture
def deployment(kafka_broker: LocalKafka, tmp_path: Path) -> Iterator[Deployment]:
    d = deploy(kafka_broker, tmp_path, "kafka")
    try:
        yield d
    finally:
        d.close()


def as_process(
    dsn: str,
    sink: AdapterSink,
    worker_id: str,
    work: Callable[[Graph], object],
    during_work: Callable[[Any], object] | None = None,
) -> None:
    """One LangGraph service instance: its own connections, the wrapped saver, the graph."""
    with PostgresSaver.from_conn_string(dsn) as saver:
        threads = PostgresThreads(dsn)
        try:
            checkpointer = SplitbrainCheckpointer(
                saver, threads=threads, sink=sink, worker_id=worker_id
            )
            work(build(checkpointer, during_work=during_work))
            assert checkpointer.flush(30)  # its puts recorded in the ledger, behind them
        finally:
            threads.close()


def test_two_runs_forking_a_thread_on_postgres_are_a_critical_finding(
    deployment: Deployment, postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    worker = deployment.worker()
    with PostgresSaver.from_conn_string(postgres_dsn) as saver:
        saver.setup()
    sink = AdapterSink(
        "langgraph",
        publisher=lambda: Emitter(deployment.config, topic=deployment.topics.input),
    )
    try:
        as_process(
            postgres_dsn, sink, "seed", lambda g: g.invoke({"notes": []}, thread(THREAD, "seed"))
        )
        # Both runs read the interrupted checkpoint before either writes its child.
        barrier = threading.Barrier(2)
        out: dict[str, Any] = {}

        def resume(name: str) -> None:
            def run(graph: Graph) -> None:
                out[name] = graph.invoke(None, thread(THREAD, name))

            as_process(postgres_dsn, sink, name, run, lambda _: barrier.wait(30))

        runs = [threading.Thread(target=resume, args=(name,)) for name in ("pod-a", "pod-b")]
        for r in runs:
            r.start()
        for r in runs:
            r.join(60)
        assert set(out) == {"pod-a", "pod-b"}, "both runs answered"
        assert sink.flush(30)
    finally:
        sink.close()

    # LangGraph's own tables: one parent with two children, and one run's note lost.
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
        deployment.config, deployment.topics.input, isolation=IsolationLevel.READ_UNCOMMITTED
    ) as events:
        lines = [r.value for r in events.read_to_end()]
    expected = audited(lines)
    assert [f["severity"] for f in expected.values()] == ["critical"]

    with deployment.reader(deployment.topics.findings) as findings:

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
