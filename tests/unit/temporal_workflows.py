"""Workflows for the Temporal adapter's tests, in a file of their own as a user's would be: the
workflow sandbox imports it afresh for every run, and `detector.adapters` with it (which then is
the worker's own, with no sandbox configuration)."""

import time

from temporalio import workflow

from detector.adapters import effect_attempted, effect_committed, progress


@workflow.defn(name="notify")
class Notify:
    """Notifies from workflow code (outside history, as some workflows do) that an order started,
    waits for the `pay` signal, then notifies that it was paid."""

    def __init__(self) -> None:
        self.paid = False

    @workflow.run
    async def run(self, order: str) -> int:
        effect_committed(f"notify/{order}/started")
        await workflow.wait_condition(lambda: self.paid)
        effect_committed(f"notify/{order}/paid")
        return workflow.info().get_current_history_length()

    @workflow.signal
    def pay(self) -> None:
        progress({"signal": "pay"})
        self.paid = True

    @workflow.query
    def state(self) -> bool:
        effect_attempted("query")  # never sent: a query is read-only, on whichever worker
        return self.paid


FIRST_TASK = 3  # the history length of a run's first workflow task
STALL_S = 3.0  # past the test's 1 s workflow task timeout


@workflow.defn(name="receipt")
class Receipt:
    """Mails an order's receipt from workflow code (outside history). The worker running the
    run's first task then pauses past the task timeout (a GC pause, a stopped VM): the server
    gives the task to another worker, which mails it again."""

    @workflow.run
    async def run(self, order: str) -> int:
        effect_committed(f"receipt/{order}")
        if workflow.info().get_current_history_length() == FIRST_TASK:
            with workflow.unsafe.sandbox_unrestricted():
                time.sleep(STALL_S)
        return workflow.info().get_current_history_length()
