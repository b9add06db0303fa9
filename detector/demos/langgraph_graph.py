"""A small LangGraph graph that two runs on one thread fork, for the adapter's tests, benchmark
and demo.

`plan` runs, then the graph stops before `work` (an interrupt, as a human-in-the-loop graph
does). Two runs that resume the thread at once (`graph.invoke(None, config)`) both read the same
checkpoint, both do `work` and both write its child: the chain forks, and the thread's state
keeps one run's note and silently drops the other's (langchain-ai/langgraph#8796).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Annotated, Any, Final, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from detector.adapters import AdapterSink
from detector.adapters.langgraph import PostgresThreads, SplitbrainCheckpointer

PODS: Final = ("pod-a", "pod-b")


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def build(
    checkpointer: BaseCheckpointSaver[Any],
    *,
    during_work: Callable[[RunnableConfig], object] | None = None,
    interrupt: bool = True,
) -> Graph:
    """`during_work(config)` runs inside `work` (a barrier, an effect call); `interrupt=False`
    runs plan, work and reply in one go (the benchmark's graph)."""

    def plan(state: Notes) -> dict[str, list[str]]:
        return {"notes": ["planned"]}

    def work(state: Notes, config: RunnableConfig) -> dict[str, list[str]]:
        if during_work is not None:
            during_work(config)
        return {"notes": [f"work by {config['configurable'].get('worker', '?')}"]}

    def reply(state: Notes) -> dict[str, list[str]]:
        return {"notes": ["replied"]}

    g = StateGraph(Notes)
    g.add_node("plan", plan)
    g.add_node("work", work)
    g.add_node("reply", reply)
    g.add_edge(START, "plan")
    g.add_edge("plan", "work")
    g.add_edge("work", "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=checkpointer, interrupt_before=["work"] if interrupt else None)


Graph = CompiledStateGraph[Notes, Any, Notes, Notes]


def thread(thread_id: str, worker: str = "?") -> RunnableConfig:
    """The config of a run on `thread_id` by `worker` (the name its note carries)."""
    return {"configurable": {"thread_id": thread_id, "worker": worker}}


def as_pod(
    dsn: str,
    sink: AdapterSink,
    worker_id: str,
    work: Callable[[Graph], object],
    during_work: Callable[[RunnableConfig], object] | None = None,
) -> None:
    """One instance of a LangGraph service on PostgreSQL: its own saver connection, its own
    ledger connection and worker id, the wrapped saver, the graph."""
    with PostgresSaver.from_conn_string(dsn) as saver:
        threads = PostgresThreads(dsn)
        try:
            checkpointer = SplitbrainCheckpointer(
                saver, threads=threads, sink=sink, worker_id=worker_id
            )
            work(build(checkpointer, during_work=during_work))
            checkpointer.flush(30)  # its puts recorded in the ledger, behind them
        finally:
            threads.close()


def fork_on_postgres(dsn: str, sink: AdapterSink, thread_id: str) -> dict[str, list[str]]:
    """Set up the database, seed `thread_id` up to the interrupt (as `pod-seed`), then resume it
    from two pods at once, both past the read before either writes. Each pod's answer."""
    ledger = PostgresThreads(dsn)
    ledger.setup()
    ledger.close()
    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
    as_pod(dsn, sink, "pod-seed", lambda g: g.invoke({"notes": []}, thread(thread_id, "seed")))
    barrier = threading.Barrier(len(PODS))
    out: dict[str, list[str]] = {}

    def resume(pod: str) -> None:
        def run(graph: Graph) -> None:
            out[pod] = graph.invoke(None, thread(thread_id, pod))["notes"]

        as_pod(dsn, sink, pod, run, lambda _: barrier.wait(30))

    runs = [threading.Thread(target=resume, args=(pod,)) for pod in PODS]
    for r in runs:
        r.start()
    for r in runs:
        r.join(60)
    return out
