"""The worker loop of the job-queue practice: claim a job, keep its lease on a heartbeat thread,
call the tool with the fence and a stable idempotency key, and complete only while the lease
holds.

The three kinds of trouble are told apart, because each needs a different answer:

- **lease lost** (an extension or a write changed zero rows): another owner has the job. The tool
  call is cancelled, the execution ends `lease_lost`, and nothing is committed.
- **the store does not answer**: ownership is uncertain. It is recorded (log line and, given an
  emitter, an `ownership_uncertain` event) with the job, the token, the last confirmed lease and
  the request id, and no new irreversible step starts. A result in hand is written only once the
  store answers again, and only if the lease still holds.
- **the tool timed out**: ownership may still hold but the outcome is unknown. The request is
  sent again with the same idempotency key (the destination answers a repeat with its earlier
  result), within the stage time limit.

Every request carries the job's idempotency key, which names the operation
(`payment:{invoice_id}:capture`, chosen when the job is enqueued), never a fresh id per try; and
the fencing token as `X-Execution-Fence`. `tool_request_started` is recorded in the store before
the request is sent; when it cannot be, the request is not sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar
from uuid import UUID, uuid4

from detector.closing import Closing
from detector.kafka.emit import DeliveryError, Emitter
from detector.leases.errors import LeaseInputError, StoreUnavailableError
from detector.leases.heartbeat import Heartbeat, Uncertainty
from detector.leases.policy import JobClass, Labels
from detector.leases.store import JobState, Lease, LeaseLost, LeaseStore, Outcome
from detector.leases.wakeup import CHECK_S, Wakeup

log = logging.getLogger(__name__)
T = TypeVar("T")

FENCE_HEADER: Final = "X-Execution-Fence"
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
JOB_HEADER: Final = "X-Execution-Job"
WORKER_HEADER: Final = "X-Execution-Worker"


class ToolFailed(Exception):  # noqa: N818 - the tool's answer, not a bug of ours
    """A tool's own error: `code` is logged (never the tool's response); `retryable` says
    whether another attempt may succeed."""

    def __init__(self, code: str, *, retryable: bool) -> None:
        super().__init__(code)
        self.code = code
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class ToolCall:
    """What a tool gets: the job, and what every request it sends must carry."""

    job_id: UUID
    job_class: str
    worker_id: str
    fencing_token: int
    attempt: int
    idempotency_key: str
    payload: Any
    labels: Labels
    try_number: int

    def headers(self) -> dict[str, str]:
        return {
            FENCE_HEADER: str(self.fencing_token),
            IDEMPOTENCY_HEADER: self.idempotency_key,
            JOB_HEADER: str(self.job_id),
            WORKER_HEADER: self.worker_id,
        }


Tool = Callable[[ToolCall], Awaitable[Any]]


class Status(StrEnum):
    """How one execution of a claimed job ended."""

    SUCCEEDED = "succeeded"
    REQUEUED = "requeued"  # failed, with attempts left
    FAILED = "failed"  # failed for good
    LEASE_LOST = "lease_lost"  # displaced: nothing committed
    REJECTED = "rejected"  # the lease lapsed before the result was written: not written
    OWNERSHIP_UNCERTAIN = "ownership_uncertain"  # the store did not answer; left for reclaim


# How long the end of a run waits for its wake-up listener to notice.
_LISTENER_END_S: Final = 4 * CHECK_S
# A final write's first try, then twice as long each time, within the lease.
_FINAL_RETRY_S: Final = 0.2
_FINAL_RETRY_MAX_S: Final = 2.0
# What a final write that committed, its answer lost, left the job in.
_LANDED: Final = {
    JobState.SUCCEEDED: Outcome.SUCCEEDED,
    JobState.QUEUED: Outcome.REQUEUED,
    JobState.FAILED: Outcome.FAILED,
    JobState.CANCELLED: Outcome.REJECTED,
}
_OUTCOMES: Final = {
    Outcome.SUCCEEDED: Status.SUCCEEDED,
    Outcome.REQUEUED: Status.REQUEUED,
    Outcome.FAILED: Status.FAILED,
    Outcome.REJECTED: Status.REJECTED,
}


@dataclass(frozen=True, slots=True)
class Execution:
    job_id: UUID
    fencing_token: int
    attempt: int
    status: Status
    reason: str | None = None


class _Lost(Exception):  # noqa: N818 - control flow inside one execution
    """The lease is gone: end the execution without committing anything."""


class _Uncertain(Exception):  # noqa: N818
    """The store did not answer: start nothing irreversible."""


class Runner(Closing):
    """One worker: runs the jobs it claims, up to `concurrency` at once (`run`), with a
    heartbeat thread per job.

    `dsn` and `classes` as for `LeaseStore`; `emitter`, if given, carries the events that cannot
    go through the store because the store does not answer (`ownership_uncertain`).
    """

    def __init__(
        self,
        dsn: str,
        classes: Iterable[JobClass],
        worker_id: str,
        *,
        emitter: Emitter | None = None,
        destination: str | None = None,
        tool_tries: int = 2,
    ) -> None:
        if tool_tries < 1:
            raise LeaseInputError("tool_tries", "expected at least 1")
        self.worker_id = worker_id
        self._dsn = dsn
        self._emitter = emitter
        self._destination = destination
        self._tool_tries = tool_tries
        self._classes = tuple(classes)
        self._store = LeaseStore(dsn, self._classes)  # claims and writes
        self._beat_store = LeaseStore(dsn, self._classes)  # the heartbeat thread's
        self._pool: ThreadPoolExecutor | None = None  # `run`'s, for its blocking calls

    def close(self) -> None:
        self._store.close()
        self._beat_store.close()

    async def run(
        self,
        job_class: str,
        tool: Tool,
        stop: asyncio.Event,
        *,
        idle_s: float = 0.5,
        concurrency: int = 1,
        listen: bool = True,
    ) -> list[Execution]:
        """Claim and run jobs of `job_class` until `stop` is set, up to `concurrency` at once
        (each with two connections of its own: its claims and writes, its heartbeat); the
        executions, in the order they ended. Idle, it polls every `idle_s`, and with `listen`
        it is also woken as soon as a job of the class is enqueued (`detector.leases.wakeup`)."""
        if concurrency < 1:
            raise LeaseInputError("concurrency", "expected at least 1")
        self._store.policy(job_class)
        wake = asyncio.Event()
        listener = None
        if listen:
            loop = asyncio.get_running_loop()
            listener = Wakeup(self._dsn, job_class, functools.partial(_set_from_thread, loop, wake))
            listener.start()
        slots = [self]
        loops: list[asyncio.Future[None]] = []
        done: list[Execution] = []
        pool = ThreadPoolExecutor(concurrency, thread_name_prefix=f"runner-{job_class}")
        self._pool = pool
        try:
            for _ in range(concurrency - 1):  # connecting blocks: not on the loop's thread
                slots.append(await self._blocking(self._slot))
            loops = [
                asyncio.ensure_future(slot._loop(job_class, tool, stop, wake, idle_s, done))
                for slot in slots
            ]
            await asyncio.gather(*loops)
        finally:
            # One loop that raised ends the others before their connections close.
            for running in loops:
                running.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if listener is not None:
                listener.stop()
                # Within one of its checks, unless it hangs in a connect: the run ends anyway.
                await self._blocking(listener.join, _LISTENER_END_S)
                if listener.is_alive():
                    log.warning("wake-up listener still ending class=%s", job_class)
            for slot in slots[1:]:
                slot.close()
            self._pool = None
            pool.shutdown()
        return done

    def _slot(self) -> Runner:
        """A runner for one more concurrent job: the same worker and thread pool, connections of
        its own."""
        slot = Runner(
            self._dsn,
            self._classes,
            self.worker_id,
            emitter=self._emitter,
            destination=self._destination,
            tool_tries=self._tool_tries,
        )
        slot._pool = self._pool
        return slot

    async def _blocking(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` on a thread: during `run`, its own pool, a thread per concurrent job (the
        loop's default pool has min(32, cores + 4) threads: on 2 cores, 16 jobs queued behind 6
        and ran at half the rate of 4)."""
        if self._pool is None:
            return await asyncio.to_thread(call, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call, *args)

    async def _stop(self, beat: Heartbeat) -> None:
        """End the heartbeat and wait for an extension in flight: one that ran after the job's
        outcome was written would find the job finished, and report the lease lost."""
        beat.finish()
        await self._blocking(beat.join)

    async def _loop(
        self,
        job_class: str,
        tool: Tool,
        stop: asyncio.Event,
        wake: asyncio.Event,
        idle_s: float,
        done: list[Execution],
    ) -> None:
        """Claim and run jobs one at a time until `stop`; idle, until woken or `idle_s`."""
        while not stop.is_set():
            wake.clear()  # a job enqueued from here on wakes this wait, or the claim finds it
            try:
                execution = await self.run_one(job_class, tool)
            except StoreUnavailableError as exc:
                log.warning("claim failed class=%s worker=%s: %s", job_class, self.worker_id, exc)
                execution = None
            if execution is not None:
                done.append(execution)
                continue
            waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())}
            try:
                await asyncio.wait(waits, timeout=idle_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()

    async def run_one(self, job_class: str, tool: Tool) -> Execution | None:
        """Claim one job of the class and run it to an end; None when there was none to claim."""
        policy = self._store.policy(job_class)
        sent = time.monotonic()  # the local lease count starts before the claim is sent
        lease = await self._blocking(self._store.claim, job_class, self.worker_id)
        if lease is None:
            return None
        loop = asyncio.get_running_loop()
        lost = asyncio.Event()
        beat = Heartbeat(
            self._beat_store,
            lease,
            policy,
            on_lost=lambda: _set_from_thread(loop, lost),
            on_uncertain=self._uncertain,
            claim_sent=sent,
        )
        beat.start()
        alive = asyncio.create_task(_report_alive(beat, policy.heartbeat_s / 2))
        try:
            execution = await self._execute(lease, policy, tool, beat, lost)
        finally:
            alive.cancel()
            await self._stop(beat)
        log.info(
            "execution job=%s token=%d attempt=%d status=%s%s",
            execution.job_id,
            execution.fencing_token,
            execution.attempt,
            execution.status,
            f" reason={execution.reason}" if execution.reason else "",
        )
        return execution

    async def _execute(
        self, lease: Lease, policy: JobClass, tool: Tool, beat: Heartbeat, lost: asyncio.Event
    ) -> Execution:
        def ended(status: Status, reason: str | None = None) -> Execution:
            return Execution(lease.job_id, lease.fencing_token, lease.attempt, status, reason)

        stage_end = time.monotonic() + policy.stage_time_limit_s
        try:
            for try_number in range(1, self._tool_tries + 1):
                await self._start_request(lease, beat)
                call = ToolCall(
                    lease.job_id,
                    lease.job_class,
                    self.worker_id,
                    lease.fencing_token,
                    lease.attempt,
                    lease.idempotency_key,
                    lease.payload,
                    lease.labels,
                    try_number,
                )
                timeout = min(policy.tool_timeout_s, stage_end - time.monotonic())
                try:
                    result = await _timed(_call(tool, call, timeout, lost), call)
                except TimeoutError:
                    reason = "stage_time_limit" if time.monotonic() >= stage_end else "tool_timeout"
                    log.warning(
                        "tool timeout job=%s token=%d try=%d class=%s reason=%s",
                        lease.job_id,
                        lease.fencing_token,
                        try_number,
                        lease.labels.tool_class,
                        reason,
                    )
                    if reason == "stage_time_limit" or try_number == self._tool_tries:
                        return await self._fail(lease, beat, reason, retryable=True, ended=ended)
                    continue  # the same idempotency key: a repeat returns the earlier outcome
                except ToolFailed as exc:
                    return await self._fail(
                        lease, beat, exc.code, retryable=exc.retryable, ended=ended
                    )
                except (_Lost, _Uncertain):
                    raise
                except Exception as exc:  # any error of the tool is a failed attempt
                    code = f"tool_error:{type(exc).__name__}"
                    return await self._fail(lease, beat, code, retryable=True, ended=ended)
                return await self._complete(lease, beat, result, ended)
        except _Lost:
            return ended(Status.LEASE_LOST)
        except _Uncertain as exc:
            return ended(Status.OWNERSHIP_UNCERTAIN, str(exc) or None)
        raise AssertionError("unreachable: every try returns or continues")

    async def _start_request(self, lease: Lease, beat: Heartbeat) -> None:
        """Record `tool_request_started`; raise `_Lost` or `_Uncertain` when the request must
        not be sent."""
        if beat.lost:
            raise _Lost
        if beat.uncertain or not beat.presumed_held():
            raise _Uncertain("lease_not_confirmed")
        try:
            answer = await self._blocking(
                functools.partial(
                    self._store.request_started,
                    lease,
                    request_id=lease.idempotency_key,
                    effect_key=lease.idempotency_key,
                    destination=self._destination,
                )
            )
        except StoreUnavailableError as exc:
            self._uncertain(Uncertainty(lease, beat.lease.lease_until, str(exc)))
            raise _Uncertain("request_not_recorded") from exc
        if isinstance(answer, LeaseLost):
            raise _Lost

    async def _complete(
        self, lease: Lease, beat: Heartbeat, result: Any, ended: Callable[..., Execution]
    ) -> Execution:
        await self._settle(lease, beat)
        write = functools.partial(self._store.complete, lease, result)
        try:
            outcome = await self._final(lease, beat, write, "result_not_recorded")
        except LeaseInputError as exc:
            # The tool's effect is done; running it again would repeat it: a failure for good.
            log.warning(
                "result not storable job=%s token=%d: %s", lease.job_id, lease.fencing_token, exc
            )
            code = f"result_unstorable:{exc.field}"
            return await self._fail(lease, beat, code, retryable=False, ended=ended)
        return ended(_OUTCOMES[outcome])

    async def _final(
        self, lease: Lease, beat: Heartbeat, write: Callable[[], Outcome], what: str
    ) -> Outcome:
        """A job's final write, tried again while its lease is presumed held: a database that
        restarts during the tool call must not throw the finished outcome away (the job would
        run again). Before each new try the job is read: a try that committed although its
        answer was lost is not written twice. `_Uncertain(what)` once the lease may be gone."""
        pause_s = _FINAL_RETRY_S
        while True:
            try:
                return await self._blocking(write)
            except StoreUnavailableError as exc:
                if not beat.presumed_held():
                    self._uncertain(Uncertainty(lease, beat.lease.lease_until, str(exc)))
                    raise _Uncertain(what) from exc
                log.warning(
                    "%s job=%s token=%d, trying again: %s",
                    what,
                    lease.job_id,
                    lease.fencing_token,
                    exc,
                )
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, _FINAL_RETRY_MAX_S)
            try:
                job = await self._blocking(self._store.job, lease.job_id)
            except StoreUnavailableError:
                continue
            if job is None or job.fencing_token != lease.fencing_token:
                return Outcome.REJECTED
            if job.state is not JobState.RUNNING:
                return _LANDED[job.state]

    async def _settle(self, lease: Lease, beat: Heartbeat) -> None:
        """Before the outcome is written: stop the heartbeat, and with ownership uncertain
        first wait (up to the stage time limit) for the store's answer to it. Lost means
        commit nothing (`_Lost`); no answer leaves the job for its lease to lapse."""
        if beat.uncertain:
            wait_s = self._store.policy(lease.job_class).stage_time_limit_s
            if not await self._blocking(beat.wait_for_answer, wait_s):
                # Recorded again: the result in hand is given up while ownership is unknown.
                self._uncertain(Uncertainty(lease, beat.lease.lease_until, "store_silent"))
                raise _Uncertain("store_silent")
        await self._stop(beat)
        if beat.lost:
            raise _Lost

    async def _fail(
        self,
        lease: Lease,
        beat: Heartbeat,
        code: str,
        *,
        retryable: bool,
        ended: Callable[..., Execution],
    ) -> Execution:
        await self._settle(lease, beat)
        write = functools.partial(self._store.fail, lease, {"code": code}, retryable=retryable)
        return ended(_OUTCOMES[await self._final(lease, beat, write, "failure_not_recorded")], code)

    def _uncertain(self, what: Uncertainty) -> None:
        """Record that ownership is uncertain: a log line, and the event if it can be sent.
        Called from the heartbeat thread as well as the loop."""
        lease = what.lease
        log.warning(
            "ownership uncertain job=%s token=%d last_lease_until=%s request=%s worker=%s: %s",
            lease.job_id,
            lease.fencing_token,
            what.last_confirmed_until.isoformat(),
            lease.idempotency_key,
            self.worker_id,
            what.error,
        )
        if self._emitter is None:
            return
        try:
            self._emitter.ownership_uncertain(
                workflow_key=str(lease.job_id),
                owner_epoch=lease.fencing_token,
                worker_id=self.worker_id,
                event_id=f"{lease.job_id}:uncertain:{uuid4().hex}",
                attrs=lease.labels.attrs() or None,
                detail={
                    "job_class": lease.job_class,
                    "attempt": lease.attempt,
                    "last_lease_until": what.last_confirmed_until.isoformat(),
                    "request": lease.idempotency_key,
                },
            )
            self._emitter.flush(5.0)
        except DeliveryError as exc:
            log.warning("ownership_uncertain not delivered job=%s: %s", lease.job_id, exc)


async def _call(tool: Tool, call: ToolCall, timeout: float, lost: asyncio.Event) -> Any:
    """The tool's answer within `timeout`; `_Lost` (the call cancelled) as soon as the
    heartbeat finds the lease lost."""
    task = asyncio.ensure_future(tool(call))
    watch = asyncio.ensure_future(lost.wait())
    try:
        done, _ = await asyncio.wait(
            {task, watch}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    if watch in done:
        raise _Lost
    raise TimeoutError


async def _timed(answer: Awaitable[Any], call: ToolCall) -> Any:
    """The tool call's answer, its duration logged whatever the outcome (ids and codes only)."""
    began = time.monotonic()
    outcome = "ok"
    try:
        return await answer
    except TimeoutError:
        outcome = "timeout"
        raise
    except ToolFailed as exc:
        outcome = f"failed:{exc.code}"
        raise
    except _Lost:
        outcome = "lease_lost"
        raise
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        log.info(
            "tool call job=%s token=%d try=%d class=%s outcome=%s duration_s=%.3f",
            call.job_id,
            call.fencing_token,
            call.try_number,
            call.labels.tool_class,
            outcome,
            time.monotonic() - began,
        )


async def _report_alive(beat: Heartbeat, every_s: float) -> None:
    """Tell the heartbeat this loop still runs; a loop blocked by a tool stops telling it."""
    while True:
        beat.report()
        await asyncio.sleep(every_s)


def _set_from_thread(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    loop.call_soon_threadsafe(event.set)
