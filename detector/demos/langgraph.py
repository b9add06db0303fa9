"""`splitbrain demo --source langgraph`: two pods resume one LangGraph thread at once, and the
thread's checkpoint chain forks.

The stack's PostgreSQL holds LangGraph's checkpoints (`PostgresSaver`) and the adapter's thread
ledger (the lease store's `langgraph_*` tables). A support agent's graph stops for approval
before its `work` step; two instances of the service both resume the thread (a retried webhook,
a double click), both read the same checkpoint, both do the work and both write its child.
LangGraph answers both and keeps one: the other pod's update is gone, without an error
(langchain-ai/langgraph#8796). The wrapped checkpointer sees the parent's second child in the
database and reports both writers' commits of it, under their two epochs.
"""

from __future__ import annotations

import importlib.util
import uuid

from detector.demos import DemoStack
from detector.demos._common import ThreadedDemo, lacks
from detector.devstack.needs import missing_program


class LangGraphDemo(ThreadedDemo):
    name = "langgraph"

    def missing(self) -> str | None:
        try:
            found = importlib.util.find_spec("langgraph.checkpoint.postgres") is not None
        except ModuleNotFoundError:  # not even langgraph
            found = False
        if not found:
            return (
                "the langgraph demo needs Python packages 'langgraph' and "
                "'langgraph-checkpoint-postgres': pip install 'splitbrain-detector[langgraph]'"
            )
        from detector.devstack.postgres import postgres_binaries  # noqa: PLC0415

        return lacks(
            self.name, missing_program("PostgreSQL for its checkpoints", postgres_binaries)
        )

    def start(self, stack: DemoStack) -> None:
        from detector.devstack.errors import StackError  # noqa: PLC0415

        if stack.dsn is None:
            raise StackError("the langgraph demo needs the stack's PostgreSQL, which did not run")
        self._run(stack, self._zombie, stack.dsn, stack.bootstrap_servers)

    def _zombie(self, dsn: str, bootstrap: str) -> None:
        from detector.demos.langgraph_graph import PODS, fork_on_postgres  # noqa: PLC0415

        say = self._said.append
        sink = self._open_sink("langgraph", bootstrap)
        thread_id = f"support-ticket-{uuid.uuid4().hex[:6]}"
        say(
            f"thread {thread_id}: the agent planned and stopped for approval "
            f"(PostgresSaver, wrapped by SplitbrainCheckpointer); {' and '.join(PODS)} "
            "both resume it now"
        )
        try:
            answers = fork_on_postgres(dsn, sink, thread_id)
        except Exception as exc:
            say(f"the LangGraph runs failed: {type(exc).__name__}: {exc}")
            return
        for pod, notes in sorted(answers.items()):
            say(f"{pod} answered {notes}")
        say(
            "LangGraph raised nothing: both runs succeeded, the thread now follows one of the "
            "two children of the checkpoint they both read, and the other pod's work is gone"
        )
        sink.flush(30)


def source() -> LangGraphDemo:
    return LangGraphDemo()
