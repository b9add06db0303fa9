"""The LangGraph checkpointer's events with LangGraph's in-memory saver (no server): runs become
owners, checkpoints progress, and two runs that fork one thread are a failover duplicate that
`audit` grades critical."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from detector.adapters import AdapterSink, Authority, effect_committed
from detector.adapters.langgraph import (
    Child,
    LocalThreads,
    Recorded,
    SplitbrainCheckpointer,
    fork_effect_key,
    workflow_key,
)
from detector.contracts.events import Kind, OwnershipEvent, Source
from detector.demos.langgraph_graph import build, thread
from detector.histories.audit import audit_lines
from tests.unit.test_adapter_sink import Recorder


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def sink(recorder: Recorder) -> Iterator[AdapterSink]:
    s = AdapterSink("langgraph", publisher=lambda: recorder, registry=CollectorRegistry())
    yield s
    s.close()


def events(sink: AdapterSink, recorder: Recorder) -> list[OwnershipEvent]:
    assert sink.flush(10)
    return recorder.events


def detail(event: OwnershipEvent) -> dict[str, Any]:
    assert event.detail is not None
    return event.detail


def fork(graph: Any, thread_id: str) -> dict[str, Any]:
    """Seed the thread up to the interrupt, then resume it from two threads at once."""
    graph.invoke({"notes": []}, thread(thread_id, "seed"))
    out: dict[str, Any] = {}

    def resume(worker: str) -> None:
        out[worker] = graph.invoke(None, thread(thread_id, worker))

    runs = [threading.Thread(target=resume, args=(w,)) for w in ("a", "b")]
    for r in runs:
        r.start()
    for r in runs:
        r.join(30)
    return out


def test_each_invocation_is_a_new_owner_and_each_checkpoint_its_progress(
    sink: AdapterSink, recorder: Recorder
) -> None:
    saver = SplitbrainCheckpointer(InMemorySaver(), sink=sink, worker_id="w1")
    graph = build(saver)
    first = graph.invoke({"notes": []}, thread("t1"))
    second = graph.invoke(None, thread("t1"))
    assert first == {"notes": ["planned"]}
    assert second == {"notes": ["planned", "work by ?", "replied"]}

    got = events(sink, recorder)
    acquisitions = [e for e in got if e.kind is Kind.LEASE_ACQUIRED]
    assert len(acquisitions) == 2
    assert acquisitions[0].owner_epoch < acquisitions[1].owner_epoch
    for e in acquisitions:  # a minted epoch is the worker's word, and says so
        assert e.source is Source.WORKER
        assert (e.attrs or {}).get("epoch_authority") == Authority.MINTED.value
        assert e.workflow_key == "t1"
        assert e.seq is None
    # Every checkpoint is its run's progress; nothing is an effect without a fork.
    steps = [(e.owner_epoch, detail(e)["step"]) for e in got if e.kind is Kind.PROGRESS]
    e1, e2 = (a.owner_epoch for a in acquisitions)
    assert steps == [(e1, -1), (e1, 0), (e1, 1), (e2, 2), (e2, 3)]
    assert not [e for e in got if e.kind is Kind.EFFECT_COMMITTED]


def test_two_runs_forking_a_thread_are_a_critical_failover_duplicate(
    sink: AdapterSink, recorder: Recorder
) -> None:
    saver = SplitbrainCheckpointer(InMemorySaver(), sink=sink, worker_id="w1")
    barrier = threading.Barrier(2)
    graph = build(saver, during_work=lambda _: barrier.wait(10))
    out = fork(graph, "t2")
    # The zombie as LangGraph shows it: both runs answered, the thread kept only one note.
    assert {tuple(v["notes"]) for v in out.values()} == {
        ("planned", "work by a", "replied"),
        ("planned", "work by b", "replied"),
    }
    assert len(graph.get_state(thread("t2")).values["notes"]) == 3

    got = events(sink, recorder)
    commits = [e for e in got if e.kind is Kind.EFFECT_COMMITTED]
    assert len(commits) == 2
    parent = detail(commits[0])["parent_id"]
    assert {c.effect_key for c in commits} == {fork_effect_key(parent)}
    epochs = {c.owner_epoch for c in commits}
    assert len(epochs) == 2  # one per run
    # The two children are the two runs' checkpoints after `work` (both step 2).
    assert {detail(c)["checkpoint_id"] for c in commits} == {
        detail(e)["checkpoint_id"]
        for e in got
        if e.kind is Kind.PROGRESS and detail(e)["step"] == 2
    }

    result = audit_lines(e.model_dump_json(exclude_none=True).encode() for e in got)
    (finding,) = (json.loads(f.to_json()) for f in result.findings.values())
    assert finding["severity"] == "critical"
    assert finding["workflow_key"] == "t2"
    assert finding["displaced"]["owner_epoch"] == min(epochs)
    assert finding["context"]["displaced"]["thread_id"] == "t2"
    assert finding["context"]["latest_condition"]["thread_id"] == "t2"
    duplicate = next(c for c in finding["conditions"] if c["kind"] == "duplicate_effect")
    assert duplicate["cause"] == "failover"
    assert duplicate["epochs"] == sorted(epochs)


def test_an_explicit_run_gives_effects_its_epoch_and_ends_in_a_release(
    sink: AdapterSink, recorder: Recorder
) -> None:
    saver = SplitbrainCheckpointer(InMemorySaver(), sink=sink, worker_id="w1")
    graph = build(saver, during_work=lambda _: effect_committed("reply-to/msg-1"), interrupt=False)
    config = thread("t3")
    with saver.run(config) as owner:
        graph.invoke({"notes": []}, config)
    assert owner is not None
    assert not effect_committed("reply-to/msg-1")  # outside the run: no owner to name

    got = events(sink, recorder)
    assert [e.kind for e in got if e.kind is not Kind.PROGRESS] == [
        Kind.LEASE_ACQUIRED,
        Kind.EFFECT_COMMITTED,
        Kind.LEASE_RELEASED,
    ]
    assert {(e.workflow_key, e.owner_epoch) for e in got} == {("t3", owner.owner_epoch)}
    committed = next(e for e in got if e.kind is Kind.EFFECT_COMMITTED)
    assert committed.effect_key == "reply-to/msg-1"
    # LangGraph's words (DESIGN §5 `context`): the thread on every event; the node and its
    # step on the effect called inside it.
    assert all(detail(e)["thread_id"] == "t3" for e in got)
    assert detail(committed) == {"thread_id": "t3", "node": "work", "step": 2}


def test_async_puts_are_watched_as_the_sync_ones(sink: AdapterSink, recorder: Recorder) -> None:
    saver = SplitbrainCheckpointer(InMemorySaver(), sink=sink, worker_id="w1")
    graph = build(saver, interrupt=False)
    out = asyncio.run(graph.ainvoke({"notes": []}, thread("t4")))
    assert out == {"notes": ["planned", "work by ?", "replied"]}
    got = events(sink, recorder)
    assert [e.kind for e in got][:2] == [Kind.LEASE_ACQUIRED, Kind.PROGRESS]
    assert len({e.owner_epoch for e in got}) == 1
    assert len([e for e in got if e.kind is Kind.PROGRESS]) == 5  # steps -1 to 3


class BrokenLedger(LocalThreads):
    def record(
        self, thread_id: str, checkpoint_ns: str, parent_id: str | None, child: Child
    ) -> Recorded:
        raise ConnectionError("ledger down")


def failures() -> float:
    value = REGISTRY.get_sample_value(
        "splitbrain_adapter_puts_unrecorded_total", {"adapter": "langgraph", "reason": "ledger"}
    )
    return value or 0.0


def test_a_failing_ledger_never_fails_the_graph(sink: AdapterSink, recorder: Recorder) -> None:
    before = failures()
    saver = SplitbrainCheckpointer(InMemorySaver(), threads=BrokenLedger(), sink=sink)
    out = build(saver, interrupt=False).invoke({"notes": []}, thread("t5"))
    assert out == {"notes": ["planned", "work by ?", "replied"]}
    assert failures() - before == 5  # one per checkpoint put, counted
    assert saver.get_tuple(thread("t5")) is not None  # the saver kept every checkpoint


class GatedLedger(LocalThreads):
    """A ledger that waits on its server (here: until the gate opens)."""

    blocking = True

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def record(
        self, thread_id: str, checkpoint_ns: str, parent_id: str | None, child: Child
    ) -> Recorded:
        assert self.gate.wait(10)
        return super().record(thread_id, checkpoint_ns, parent_id, child)


def test_a_blocking_ledger_records_behind_the_puts_in_order(
    sink: AdapterSink, recorder: Recorder
) -> None:
    gate = threading.Event()
    saver = SplitbrainCheckpointer(InMemorySaver(), threads=GatedLedger(gate), sink=sink)
    out = build(saver, interrupt=False).invoke({"notes": []}, thread("t6"))
    assert out == {"notes": ["planned", "work by ?", "replied"]}  # no put waited for the ledger
    assert not saver.flush(0.2)
    gate.set()
    assert saver.flush(10)
    got = events(sink, recorder)
    assert [detail(e)["step"] for e in got if e.kind is Kind.PROGRESS] == [-1, 0, 1, 2, 3]


def test_postgres_saver_with_the_in_process_ledger_says_what_it_cannot_see(
    sink: AdapterSink, caplog: pytest.LogCaptureFixture
) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415

    SplitbrainCheckpointer(InMemorySaver(), sink=sink)
    assert not caplog.records
    SplitbrainCheckpointer(PostgresSaver(None), sink=sink)  # type: ignore[arg-type]
    (record,) = caplog.records
    assert "PostgresSaver" in record.message and "PostgresThreads" in record.message


def test_a_forked_child_records_its_own_puts_only(sink: AdapterSink, recorder: Recorder) -> None:
    gate = threading.Event()
    saver = SplitbrainCheckpointer(InMemorySaver(), threads=GatedLedger(gate), sink=sink)
    build(saver, interrupt=False).invoke({"notes": []}, thread("parent"))  # 5 puts wait
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one put of its own, then what was published in it, by thread
        try:
            gate.set()
            config: Any = {"configurable": {"thread_id": "child", "checkpoint_ns": ""}}
            saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
            flushed = saver.flush(10)
            seen = [[e.workflow_key, e.kind.value] for e in recorder.events]
            os.write(write, json.dumps([flushed, seen]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    flushed, seen = json.loads(os.read(read, 65536))
    os.close(read)
    assert flushed
    # The child recorded its own put; the parent's five, queued before the fork, are not its.
    assert [k for t, k in seen if t == "child"] == ["lease_acquired", "progress"]
    assert [k for t, k in seen if t == "parent"] in ([], ["lease_acquired"])  # sent pre-fork
    gate.set()
    assert saver.flush(10)
    assert len([e for e in events(sink, recorder) if e.kind is Kind.PROGRESS]) == 5


def test_a_subgraph_namespace_is_its_own_key() -> None:
    assert workflow_key("t", "") == "t"
    assert workflow_key("t", "inner:1") == "t/inner:1"
    assert fork_effect_key(None) == "checkpoint-child/root"


def test_local_threads_epochs_grow_and_a_second_child_is_a_fork() -> None:
    ledger = LocalThreads()
    e1, _ = ledger.begin("t", "")
    e2, _ = ledger.begin("t", "")
    assert e2 > e1
    one = Child("c1", e1, "w1", None)
    assert ledger.record("t", "", "p", one) == Recorded(None, None)
    assert ledger.record("t", "", "p", one) == Recorded(None, None)  # the same put again
    assert ledger.record("t", "", "p", Child("c2", e2, "w2", None)) == Recorded(None, one)
