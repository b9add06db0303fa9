"""Workflows for the Temporal adapter's tests, in a file of their own as a user's would be: the
workflow sandbox imports it afresh for every run, and `detector.adapters` with it (which then is
the worker's own, with no sandbox configuration)."""

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
