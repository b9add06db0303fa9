"""Temporal: every activity attempt, and every workflow run's worker, as a lease, through one
worker interceptor.

    from detector.adapters.temporal import SplitbrainInterceptor
    Worker(client, ..., interceptors=[SplitbrainInterceptor(worker_id=client.identity)])

and, inside an activity or workflow code, `detector.adapters.effect_committed("charge/o1")`.

The server assigns each attempt and answers NOT_FOUND to any other attempt's heartbeat or
completion: the attempt is a fencing token (ADAPTERS.md, authority A). But it fences only the
server's own state, and tells the displaced attempt only when that attempt heartbeats, so an
attempt that outlives its heartbeat timeout keeps acting: this interceptor makes that visible.

- Key: namespace / workflow id / run id / activity id (a workflow reset or continue-as-new is a
  new run, hence a new key).
- Epoch: the attempt's scheduled time (ms, the server's clock) times 1000, plus the attempt. An
  activity reset starts again at attempt 1, but later: the epoch still grows. Within one
  incarnation it orders attempts as the attempt number does, unless the server's clock stepped
  back by more than the retry's backoff between two attempts. Local activities count attempts
  on the worker, with no server fence: their epoch is `approximate`, their acquisition the
  worker's word.
- Words (DESIGN §5 `context`, `activity_words`): the activity, its attempt and its workflow on
  every event of the attempt, so a finding says "attempt 1" and "attempt 2" even when one
  worker ran both (`worker_id` stays the worker's identity); `outlived` once the attempt
  outlived a timeout by the worker's clock. The SDK does not tell an attempt why the previous
  one ended: that is the displaced attempt's own events to say.
- No `seq`: the server exposes no order per attempt (the task token is internal), so the
  detector orders these events by arrival (DESIGN §4: at most medium confidence).
- Invisible here: a zombie's completion that the server rejects (only the SDK logs it), and
  `lease_lost` for an attempt that never heartbeats, which is never told.

Workflows: the worker that runs a run's workflow tasks owns it, and only the current task's
completion is accepted by the server. Key: namespace / workflow id / run id. Epoch and `seq`:
the history length (`get_current_history_length()`), which the server assigns, only grows per
run and orders everything the run did (ADAPTERS.md, authority A). The epoch is the length at the
first point this worker's instance of the run runs live (after replaying what others or a
previous instance did), so a worker that takes a run over has a higher epoch than any task before
it. Nothing is sent while replaying, in a query or in an update validator: the events of history
were sent when it was made. Effect calls in workflow code carry the run's key, epoch and `seq`:
an effect of a workflow task that the server timed out, done again by the task that replaced it,
is a failover duplicate ordered by `seq`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Concatenate, Final, ParamSpec, Self, TypeVar

import temporalio.activity
import temporalio.exceptions
import temporalio.workflow
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from detector.contracts.events import MAX_KEY_CHARS, MAX_LABEL_CHARS, MAX_WORKER_ID_CHARS, Kind

from ._context import Authority, Ownership, owning, words
from ._sink import AdapterSink, owner_fields

__all__ = [
    "EPOCH_FROM",
    "RUN_EPOCH_FROM",
    "SplitbrainInterceptor",
    "owner_epoch",
    "run_key",
    "workflow_key",
]

log = logging.getLogger(__name__)
_A = TypeVar("_A")
_P = ParamSpec("_P")

ADAPTER: Final = "temporal"
EPOCH_FROM: Final = "temporal.scheduled_ms*1000+attempt"
RUN_EPOCH_FROM: Final = "temporal.history_length"
_ATTEMPT_SPAN: Final = 1000  # the attempt only breaks ties between equal scheduled times
_LOST: Final = ("not_found", "timed_out", "reset", "paused")  # the server took the attempt away
_SDK_THROTTLE_S: Final = 30.0  # the SDK's default heartbeat throttle without a timeout
_THROTTLE_SHARE: Final = 0.8  # ... and its share of the heartbeat timeout


def _fit(key: str) -> str:
    """A key longer than the contract's 512 characters is cut and ends in a hash of the whole."""
    if len(key) <= MAX_KEY_CHARS:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{key[: MAX_KEY_CHARS - 33]}#{digest}"


def workflow_key(info: temporalio.activity.Info) -> str:
    """An activity's: namespace/workflow/run/activity (a standalone activity: namespace/-/its
    run/activity)."""
    if info.workflow_id is not None:
        return _fit(
            f"{info.namespace}/{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
        )
    return _fit(f"{info.namespace}/-/{info.activity_run_id}/{info.activity_id}")


def run_key(info: temporalio.workflow.Info) -> str:
    """A workflow run's: namespace/workflow/run (its activities' keys go one level deeper)."""
    return _fit(f"{info.namespace}/{info.workflow_id}/{info.run_id}")


def owner_epoch(info: temporalio.activity.Info) -> int:
    """Grows with each attempt, and across an activity reset (which restarts at attempt 1)."""
    scheduled_ms = max(math.floor(info.current_attempt_scheduled_time.timestamp() * 1000), 0)
    return scheduled_ms * _ATTEMPT_SPAN + min(info.attempt, _ATTEMPT_SPAN - 1)


def activity_words(info: temporalio.activity.Info) -> dict[str, Any]:
    """An attempt in Temporal's words (DESIGN §5 `context`): the activity type and attempt, and
    the workflow it belongs to. The epoch orders attempts; these name them, even when one worker
    process ran both."""
    return words(
        activity=info.activity_type,
        attempt=info.attempt,
        activity_id=info.activity_id,
        workflow=info.workflow_type,
        workflow_id=info.workflow_id,
        run_id=info.workflow_run_id,
        local=True if info.is_local else None,
    )


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value else None


def _guarded(method: Callable[Concatenate[_A, _P], None]) -> Callable[Concatenate[_A, _P], None]:
    """The host's activity or workflow never sees a failure of ours: it is logged, never raised."""

    @functools.wraps(method)
    def wrapper(self: _A, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception:
            log.exception("temporal adapter: %s failed", method.__name__)

    return wrapper


@contextmanager
def _ending(end: Callable[[str | None, str | None], None]) -> Iterator[None]:
    """Runs `end(outcome, error class)` after the block: completed, failed, cancelled, continued
    as new (a workflow), or None when an activity completes asynchronously (it goes on
    elsewhere)."""
    outcome: str | None = "failed"
    error: str | None = None
    try:
        yield
        outcome = "completed"
    except temporalio.activity._CompleteAsyncError:
        outcome = None
        raise
    except temporalio.workflow.ContinueAsNewError:
        outcome = "continued_as_new"
        raise
    except (asyncio.CancelledError, temporalio.exceptions.CancelledError):
        outcome = "cancelled"
        raise
    except BaseException as exc:
        error = type(exc).__name__[:MAX_LABEL_CHARS]
        raise
    finally:
        end(outcome, error)


class _Attempt:
    """One attempt's lease, from its start to its end, on the worker's event loop."""

    def __init__(self, info: temporalio.activity.Info, sink: AdapterSink, worker_id: str) -> None:
        local = info.is_local
        self.ownership = Ownership(
            sink,
            workflow_key(info),
            owner_epoch(info),
            worker_id,
            Authority.APPROXIMATE if local else Authority.SYSTEM,
            EPOCH_FROM,
            {
                "tool_class": info.activity_type[:MAX_LABEL_CHARS],
                "temporal_activity": "local" if local else "server",
            },
            activity_words(info),
        )
        self.attempt = info.attempt
        self.heartbeat_timeout = _seconds(info.heartbeat_timeout)
        self.start_to_close = _seconds(info.start_to_close_timeout)
        self.beat_every = (
            _THROTTLE_SHARE * self.heartbeat_timeout if self.heartbeat_timeout else _SDK_THROTTLE_S
        )
        self.started = self.last_beat = time.monotonic()
        self.last_beat_sent = -math.inf
        self.uncertain = False
        self.lost = False
        self.done = False
        self.timer: asyncio.TimerHandle | None = None

    @_guarded
    def start(self) -> None:
        self._arm()  # first: an acquisition that could not be sent still has its lease timed
        self.ownership.acquired(lease_duration_s=self.heartbeat_timeout or self.start_to_close)

    @_guarded
    def heartbeat(self) -> None:
        if self.done:
            return
        self.last_beat = now = time.monotonic()
        self._check_lost()
        if self.lost:
            return
        if self.uncertain:  # heartbeating again: time the new silence
            self.uncertain = False
            self._arm()
        if now - self.last_beat_sent >= self.beat_every:
            self.last_beat_sent = now
            self.ownership.emit(Kind.HEARTBEAT)

    @_guarded
    def end(self, outcome: str | None, error: str | None = None) -> None:
        """`outcome` None: completing asynchronously, the attempt goes on outside this worker."""
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        self._check_lost()
        if outcome is not None:
            detail = {"outcome": outcome} if error is None else {"outcome": outcome, "error": error}
            self.ownership.emit(Kind.LEASE_RELEASED, detail=detail)

    # ---- the lease's deadline, by the worker's clock --------------------------------------------

    def _deadline(self) -> tuple[float, str] | None:
        deadlines = []
        if self.heartbeat_timeout:
            deadlines.append((self.last_beat + self.heartbeat_timeout, "heartbeat_timeout"))
        if self.start_to_close:
            deadlines.append((self.started + self.start_to_close, "start_to_close_timeout"))
        return min(deadlines) if deadlines else None

    def _arm(self) -> None:
        deadline = self._deadline()
        if deadline is not None:
            delay = max(deadline[0] - time.monotonic(), 0.0)
            self.timer = asyncio.get_running_loop().call_later(delay, self._expire)

    @_guarded
    def _expire(self) -> None:
        self.timer = None
        if self.done:
            return
        self._check_lost()
        deadline = self._deadline()
        if self.lost or deadline is None:
            return
        if time.monotonic() < deadline[0]:  # a heartbeat moved it
            self._arm()
            return
        self.uncertain = True
        self.ownership.note(outlived=deadline[1])  # its later effects say so too
        self.ownership.emit(Kind.OWNERSHIP_UNCERTAIN, detail={"reason": deadline[1]})

    def _check_lost(self) -> None:
        if self.lost:
            return
        details = temporalio.activity.cancellation_details()
        reasons = [r for r in _LOST if details is not None and getattr(details, r)]
        if reasons:
            self.lost = True
            self.ownership.note(lost=reasons[0])
            self.ownership.emit(Kind.LEASE_LOST, detail={"reason": reasons[0]})


class _Outbound(ActivityOutboundInterceptor):
    def __init__(self, next: ActivityOutboundInterceptor, inbound: _Inbound) -> None:
        super().__init__(next)
        self._inbound = inbound

    def heartbeat(self, *details: Any) -> None:
        super().heartbeat(*details)
        attempt = self._inbound.attempt
        if attempt is not None:
            attempt.heartbeat()


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, root: SplitbrainInterceptor) -> None:
        super().__init__(next)
        self._root = root
        self.attempt: _Attempt | None = None

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        super().init(_Outbound(outbound, self))

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        attempt = self.attempt = self._root._begin()
        if attempt is None:
            return await super().execute_activity(input)
        # Sync activities see the ownership too: the SDK runs them in a copy of this context
        # (threads; a process pool gets only the lifecycle events, not the user's effect calls).
        with _ending(attempt.end), owning(attempt.ownership):
            return await super().execute_activity(input)


# ---- workflows -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _RunState:
    acquired: bool = False
    replayed: bool = False  # the instance replayed history before it ran live


@dataclass(frozen=True)
class _RunOwnership(Ownership):
    """A workflow run, as this worker's instance of it holds it. Its epoch is known only once the
    run is live here (`owner_epoch` is 0 before): the history length at that point. Every event
    carries the history length as `seq`; none is sent while replaying or read-only."""

    lease_s: float | None = None  # the workflow task timeout: a task not done by then goes on
    state: _RunState = field(default_factory=_RunState)

    @classmethod
    def of(cls, info: temporalio.workflow.Info, sink: AdapterSink, worker_id: str) -> Self:
        return cls(
            sink,
            run_key(info),
            0,
            worker_id,
            Authority.SYSTEM,
            RUN_EPOCH_FROM,
            {"tool_class": info.workflow_type[:MAX_LABEL_CHARS], "temporal_task": "workflow"},
            words(
                workflow=info.workflow_type,
                workflow_id=info.workflow_id,
                run_id=info.run_id,
                attempt=info.attempt,
            ),
            lease_s=_seconds(info.task_timeout),
        )

    def _live(self) -> bool:
        """Workflow code running for the first time: not history replayed, and not a query or an
        update validator (read-only, and a query may run on any worker)."""
        unsafe = temporalio.workflow.unsafe
        if unsafe.is_replaying():
            self.state.replayed = True
            return False
        return not unsafe.is_read_only()

    def emit(self, kind: Kind, **fields: Any) -> None:
        """Send one event of the run the adapter made (see `_send`)."""
        self._send(super().emit, kind, fields)

    def checked(self, kind: Kind, **fields: Any) -> None:
        """Send one event of the user's effect calls in workflow code (see `_send`)."""
        self._send(super().checked, kind, fields)

    def _send(self, send: Callable[..., None], kind: Kind, fields: dict[str, Any]) -> None:
        """Only when live, acquiring the run first if this is its first live moment here, with
        the history length as `seq`; never raises into the workflow, and changes nothing of its
        history."""
        try:
            if self._live():
                if not self.state.acquired:
                    self._acquire()
                send(kind, seq=temporalio.workflow.info().get_current_history_length(), **fields)
        except Exception:
            log.exception("temporal adapter: a workflow event was not sent")

    def _acquire(self) -> None:
        # The one field that changes: the epoch becomes known (every event reads it from here).
        epoch = temporalio.workflow.info().get_current_history_length()
        object.__setattr__(self, "owner_epoch", epoch)
        object.__setattr__(
            self, "_fields", owner_fields(self.workflow_key, epoch, self.worker_id, self._attrs())
        )
        self.state.acquired = True
        self.acquired(lease_duration_s=self.lease_s, detail={"replayed": self.state.replayed})

    @_guarded
    def touch(self) -> None:
        """At a hook of the run: acquire it if it is live here for the first time."""
        if not self.state.acquired and self._live():
            self._acquire()

    def end(self, outcome: str | None, error: str | None = None) -> None:
        detail = {"outcome": outcome} if error is None else {"outcome": outcome, "error": error}
        self.emit(Kind.LEASE_RELEASED, detail=detail)


class _WorkflowInbound(WorkflowInboundInterceptor):
    """One per workflow run the worker holds (the SDK makes one with each instance, including
    one rebuilt by replay). The class is the worker's own, not the sandbox's copy: its code and
    the adapter's modules run outside the sandbox's restrictions (it only reads the run's info)."""

    root: ClassVar[SplitbrainInterceptor]
    _run: _RunOwnership | None = None

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(outbound)
        self._run = self.root._workflow_run(outbound)  # `workflow.info()` works only after init

    def _owning(self) -> AbstractContextManager[object]:
        run = self._run
        if run is None:
            return nullcontext()
        run.touch()
        return owning(run)

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        run = self._run
        if run is None:
            return await super().execute_workflow(input)
        with _ending(run.end), self._owning():
            return await super().execute_workflow(input)

    async def handle_signal(self, input: HandleSignalInput) -> None:
        with self._owning():
            await super().handle_signal(input)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        with self._owning():
            return await super().handle_update_handler(input)


class SplitbrainInterceptor(Interceptor):
    """Activity attempts as leases: `lease_acquired` at the start (a coordinator's, for a
    server-scheduled attempt), `heartbeat` (at the SDK's own throttle), `lease_lost` when the
    server cancels the attempt as not found, timed out, reset or paused, `ownership_uncertain`
    when the attempt's heartbeat or start-to-close timeout passes by the worker's clock, and
    `lease_released` at the end. Workflow runs as leases of the worker running their tasks:
    `lease_acquired` when a run is first live on this worker, `lease_released` when it ends, each
    with the history length as `seq`, and never while replaying. Never raises into the activity
    or workflow; Kafka down is counted drops. Sandboxed workflows need no configuration."""

    def __init__(self, sink: AdapterSink | None = None, *, worker_id: str | None = None) -> None:
        """`worker_id`: the worker's identity (`client.identity`; by default Temporal's own
        default, pid@host). It must be given here: `activity.client()` is not available in a
        synchronous activity. `sink` defaults to one configured by `SPLITBRAIN_*` variables."""
        self.sink = sink if sink is not None else AdapterSink(ADAPTER)
        worker_id = worker_id or f"{os.getpid()}@{socket.gethostname()}"
        self.worker_id = worker_id[:MAX_WORKER_ID_CHARS]

        class _Bound(_WorkflowInbound):  # the SDK makes the class with only `next`
            root: ClassVar[SplitbrainInterceptor] = self

        self._workflow_class = _Bound

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return self._workflow_class

    def _begin(self) -> _Attempt | None:
        try:
            attempt = _Attempt(temporalio.activity.info(), self.sink, self.worker_id)
        except Exception:
            log.exception("temporal adapter: the attempt could not be read")
            return None
        attempt.start()
        return attempt

    def _workflow_run(self, outbound: WorkflowOutboundInterceptor) -> _RunOwnership | None:
        try:
            return _RunOwnership.of(outbound.info(), self.sink, self.worker_id)
        except Exception:
            log.exception("temporal adapter: the workflow run could not be read")
            return None
