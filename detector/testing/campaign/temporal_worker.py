"""A campaign's Temporal worker process: one worker with the adapter's interceptor, on the run's
task queue, through its own TCP proxy to the server (the nemesis cuts it), doing the work of the
`temporal-activity` or `temporal-workflow` source.

- `activity`: one heartbeating activity per unit of work, charging the unit's order at the end.
  The ground truth is the server's description of the activity, read at the charge: the attempt
  still owns it while it is the pending activity's current attempt.
- `workflow`: workflow code mailing a receipt per step, each step a slow workflow task. The
  ground truth is the run's history, read at the mail: the task still owns the run unless the
  history shows it timed out or failed, or the run closed.

Both read the server directly (never through the proxy: the recording destination asks the
server, not the worker), twice around the write: it was owned when both reads say so. The
section from the effect's attempt to its commit blocks the worker's event loop, as a
synchronous write would: a cancellation or a worker shutdown cannot land inside it.

`python -m detector.testing.campaign.temporal_worker --role activity --target PROXY --server
SERVER --queue Q --identity ID --control DIR`, stopped by SIGTERM (a graceful shutdown).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final, TypeVar

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from detector.adapters import AdapterSink, current, effect_attempted, effect_committed
from detector.adapters.temporal import SplitbrainInterceptor
from detector.testing.campaign.truth import TruthLog, owner_of
from detector.testing.campaign.worker import sink

_T = TypeVar("_T")

READY: Final = "campaign worker polling"  # in the log once the worker polls
ACTIVITY: Final = "campaign-charge"
ACTIVITY_WORKFLOW: Final = "campaign-order"
RECEIPTS_WORKFLOW: Final = "campaign-receipts"
HEARTBEAT_TIMEOUT: Final = timedelta(seconds=2)
TASK_TIMEOUT: Final = timedelta(seconds=3)  # the workflow source's lease
BEATS: Final = 2  # an activity's work: this many beats ...
BEAT_S: Final = 0.2  # ... this far apart, heartbeating at each, ...
CALL_S: Final = 0.8  # ... then a call to the payment provider, silent, before the charge
STALL_S: Final = 0.8  # a workflow step's task: this long in workflow code
STEPS: Final = 2  # receipts per workflow run
FAILING: Final = "failing"  # in --control: while it exists, work raises before its effect
DESTINATION: Final = "campaign-ledger"
_CLOSED: Final = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
}


class InjectedError(RuntimeError):
    """The nemesis's `exception_retry`: the work fails before its effect, the system retries."""


@dataclass(frozen=True)
class Reader:
    """The recording destination's view of the server: a client of its own on a loop of its own
    (a thread), so workflow code, which must not await, can read the server too."""

    loop: asyncio.AbstractEventLoop
    client: Client

    @classmethod
    def connect(cls, target: str) -> Reader:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="truth-reader", daemon=True).start()
        client = asyncio.run_coroutine_threadsafe(Client.connect(target), loop).result(30)
        return cls(loop, client)

    def read(self, call: Callable[[Client], Awaitable[_T]]) -> _T:
        async def run() -> _T:
            return await call(self.client)

        future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(30)


@dataclass
class _Ledger:
    """The recording destination, as this process reaches it (set once, at the start)."""

    reader: Reader | None = None
    truth: TruthLog | None = None
    control: Path | None = None


_ledger = _Ledger()


def _failing() -> bool:
    """The nemesis asked this worker's work to fail for now (`exception_retry`)."""
    assert _ledger.control is not None
    return (_ledger.control / FAILING).exists()


def _record(effect_key: str, owned: Callable[[Client], Awaitable[tuple[bool, str]]]) -> None:
    """The write, between two reads of the server's record of the executor's ownership: owned
    when both say so (taken away in between, it did not own it through the write)."""
    owner = current()
    reader, truth = _ledger.reader, _ledger.truth
    assert owner is not None and reader is not None and truth is not None
    effect_attempted(effect_key, destination=DESTINATION)
    before, said = reader.read(owned)
    after, said_after = reader.read(owned)
    truth.record(
        **owner_of(owner),
        effect_key=effect_key,
        owned=before and after,
        evidence=said if said == said_after else f"{said}; then {said_after}",
    )
    effect_committed(effect_key, destination=DESTINATION)


# ---- the activity source ----------------------------------------------------------------------


def _attempt_owned(
    info: activity.Info,
) -> Callable[[Client], Awaitable[tuple[bool, str]]]:
    async def read(client: Client) -> tuple[bool, str]:
        handle = client.get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
        described = await handle.describe()
        if described.status is not WorkflowExecutionStatus.RUNNING:
            return False, f"server: workflow {described.status.name if described.status else '?'}"
        for pending in described.raw_description.pending_activities:
            if pending.activity_id == info.activity_id:
                state = PendingActivityState.Name(pending.state)
                started = pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
                mine = pending.attempt == info.attempt and started
                return mine, f"server: attempt {pending.attempt} {state}"
        return False, "server: the activity is no longer pending"

    return read


@activity.defn(name=ACTIVITY)
async def charge(order: str) -> None:
    """Works in heartbeating beats, calls the provider, then charges the order (once per
    attempt that gets there)."""
    for _ in range(BEATS):
        activity.heartbeat()
        await asyncio.sleep(BEAT_S)
    await asyncio.sleep(CALL_S)
    if _failing():
        raise InjectedError("the charge failed before it was made")
    _record(f"charge/{order}", _attempt_owned(activity.info()))


@workflow.defn(name=ACTIVITY_WORKFLOW, sandboxed=False)
class Order:
    @workflow.run
    async def run(self, order: str) -> None:
        await workflow.execute_activity(
            ACTIVITY,
            order,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )


# ---- the workflow source ----------------------------------------------------------------------


def _task_owned(
    info: workflow.Info, started: int
) -> Callable[[Client], Awaitable[tuple[bool, str]]]:
    async def read(client: Client) -> tuple[bool, str]:
        history = await client.get_workflow_handle(
            info.workflow_id, run_id=info.run_id
        ).fetch_history()
        for event in history.events:
            if event.event_type in _CLOSED:
                attrs = (
                    event.workflow_task_timed_out_event_attributes
                    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
                    else event.workflow_task_failed_event_attributes
                )
                if attrs.started_event_id == started:
                    what = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
                    return False, f"history: task of event {started} {what} at {event.event_id}"
        last = history.events[-1] if history.events else None
        if last is not None and last.event_type in _RUN_CLOSED:
            return False, f"history: the run closed (event {last.event_id})"
        return (
            True,
            f"history: task started at event {started} open, of {len(history.events)} events",
        )

    return read


_RUN_CLOSED: Final = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


@workflow.defn(name=RECEIPTS_WORKFLOW, sandboxed=False)
class Receipts:
    """Mails a receipt per step from workflow code, each in a slow workflow task (a heavy
    computation, a blocking call): what a task does live, never again while replaying."""

    @workflow.run
    async def run(self, order: str) -> None:
        for step in range(STEPS):
            if not workflow.unsafe.is_replaying():
                # Blocking, as a heavy call is (not `time.sleep`: under libfaketime's stepped
                # clock it fails with EINVAL).
                threading.Event().wait(STALL_S)
                if _failing():
                    raise InjectedError("the workflow task failed before its receipt")
                info = workflow.info()
                _record(
                    f"receipt/{order}/{step}", _task_owned(info, info.get_current_history_length())
                )
            await workflow.sleep(timedelta(milliseconds=100))


# ---- the process --------------------------------------------------------------------------------


def _worker(
    role: str, client: Client, queue: str, adapter_sink: AdapterSink, identity: str
) -> Worker:
    interceptor = SplitbrainInterceptor(adapter_sink, worker_id=identity)
    if role == "activity":
        return Worker(
            client,
            task_queue=queue,
            workflows=[Order],
            activities=[charge],
            interceptors=[interceptor],
            max_concurrent_activities=3,
            max_cached_workflows=0,  # no sticky queue waiting on a stopped worker
            graceful_shutdown_timeout=timedelta(seconds=1),
        )
    return Worker(
        client,
        task_queue=queue,
        workflows=[Receipts],
        interceptors=[interceptor],
        max_cached_workflows=0,
        max_concurrent_workflow_tasks=1,
        debug_mode=True,  # no deadlock detection: a stopped task goes on when woken
    )


async def _serve(args: argparse.Namespace) -> None:
    _ledger.truth = TruthLog.from_env()
    assert _ledger.truth is not None, "a campaign worker runs under a campaign"
    _ledger.control = Path(args.control)
    _ledger.reader = Reader.connect(args.server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    client = await Client.connect(args.target, identity=args.identity)
    adapter_sink = sink("temporal")
    try:
        async with _worker(args.role, client, args.queue, adapter_sink, args.identity):
            print(READY, flush=True)
            await stop.wait()
    finally:
        adapter_sink.close(10)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m detector.testing.campaign.temporal_worker")
    p.add_argument("--role", choices=["activity", "workflow"], required=True)
    p.add_argument("--target", required=True, help="the server as the worker reaches it")
    p.add_argument("--server", required=True, help="the server, directly (the ground truth)")
    p.add_argument("--queue", required=True)
    p.add_argument("--identity", required=True)
    p.add_argument("--control", required=True, help="the nemesis's directory for this worker")
    args = p.parse_args(argv)
    code = 0
    try:
        asyncio.run(_serve(args))
    except Exception as exc:
        print(f"campaign worker failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the SDK's runtime threads can abort the interpreter's teardown


if __name__ == "__main__":
    main()
