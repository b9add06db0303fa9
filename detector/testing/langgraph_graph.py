"""A small LangGraph graph that two runs on one thread fork, for the adapter's tests, benchmark
and demo.

`plan` runs, then the graph stops before `work` (an interrupt, as a human-in-the-loop graph
does). Two runs that resume the thread at once (`graph.invoke(None, config)`) both read the same
checkpoint, both do `work` and both write its child: the chain forks, and the thread's state
keeps one run's note and silently drops the other's (langchain-ai/langgraph#8796).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def build(
    checkpointer: BaseCheckpointSaver[Any],
    *,
    during_work: Callable[[RunnableConfig], object] | None = None,
    interrupt: bool = True,
) -> CompiledStateGraph[Notes, Any, Notes, Notes]:
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


def thread(thread_id: str, worker: str = "?") -> RunnableConfig:
    """The config of a run on `thread_id` by `worker` (the name its note carries)."""
    return {"configurable": {"thread_id": thread_id, "worker": worker}}
