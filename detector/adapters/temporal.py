"""Temporal: every activity attempt as a lease, through a worker interceptor.

    from detector.adapters.temporal import SplitbrainInterceptor
    Worker(client, ..., interceptors=[SplitbrainInterceptor(worker_id=client.identity)])

and, inside an activity, `detector.adapters.effect_committed("charge/o1")`.

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
- No `seq`: the server exposes no order per attempt (the task token is internal), so the
  detector orders these events by arrival (DESIGN §4: at most medium confidence).
- Invisible here: a zombie's completion that the server rejects (only the SDK logs it), and
  `lease_lost` for an attempt that never heartbeats, which is never told.
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
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

import temporalio.activity
import temporalio.exceptions
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from detector.contracts.events import Kind

from ._context import Authority, Ownership, owning
from ._sink import AdapterSink

__all__ = [
    "EPOCH_FROM",
    "SplitbrainInterceptor",
    "owner_epoch",
    "workflow_key",
]

log = logging.getLogger(__name__)
_A = TypeVar("_A")
_P = ParamSpec("_P")

ADAPTER: Final = "temporal"
EPOCH_FROM: Final = "temporal.scheduled_ms*1000+attempt"
MAX_KEY: Final = 512
_ATTEMPT_SPAN: Final = 1000  # the attempt only breaks ties between equal scheduled times
_LABEL: Final = 128
_LOST: Final = ("not_found", "timed_out", "reset", "paused")  # the server took the attempt away
_SDK_THROTTLE_S: Final = 30.0  # the SDK's default heartbeat throttle without a timeout
_THROTTLE_SHARE: Final = 0.8  # ... and its share of the heartbeat timeout


def workflow_key(info: temporalio.activity.Info) -> str:
    """namespace/workflow/run/activity (a standalone activity: namespace/-/its run/activity);
    one longer than the contract's 512 characters is cut and ends in a hash of the whole."""
    if info.workflow_id is not None:
        key = f"{info.namespace}/{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
    else:
        key = f"{info.namespace}/-/{info.activity_run_id}/{info.activity_id}"
    if len(key) <= MAX_KEY:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{key[: MAX_KEY - 33]}#{digest}"


def owner_epoch(info: temporalio.activity.Info) -> int:
    """Grows with each attempt, and across an activity reset (which restarts at attempt 1)."""
    scheduled_ms = max(math.floor(info.current_attempt_scheduled_time.timestamp() * 1000), 0)
    return scheduled_ms * _ATTEMPT_SPAN + min(info.attempt, _ATTEMPT_SPAN - 1)


def _seconds(value: timedelta | None) -> float | None:
    return value.total_seconds() if value else None


def _guarded(method: Callable[Concatenate[_A, _P], None]) -> Callable[Concatenate[_A, _P], None]:
    """The host's activity never sees a failure of ours: it is logged, never raised."""

    @functools.wraps(method)
    def wrapper(self: _A, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception:
            log.exception("temporal adapter: %s failed", method.__name__)

    return wrapper


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
                "tool_class": info.activity_type[:_LABEL],
                "temporal_activity": "local" if local else "server",
            },
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
        self.ownership.acquired(
            lease_duration_s=self.heartbeat_timeout or self.start_to_close,
            detail={"attempt": self.attempt},
        )
        self._arm()

    @_guarded
    def heartbeat(self) -> None:
        if self.done:
            return
        self.last_beat = now = time.monotonic()
        self._check_lost()
        if self.lost:
            return
        if now - self.last_beat_sent >= self.beat_every:
            self.last_beat_sent = now
            self.ownership.emit(Kind.HEARTBEAT)
        if self.uncertain:  # heartbeating again: time the new silence
            self.uncertain = False
            self._arm()

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
        self.ownership.emit(Kind.OWNERSHIP_UNCERTAIN, detail={"reason": deadline[1]})

    def _check_lost(self) -> None:
        if self.lost:
            return
        details = temporalio.activity.cancellation_details()
        reasons = [r for r in _LOST if details is not None and getattr(details, r)]
        if reasons:
            self.lost = True
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
        outcome: str | None = "failed"
        error: str | None = None
        try:
            # Sync activities see it too: the SDK runs them in a copy of this context (threads;
            # a process pool gets only the lifecycle events, not the user's effect calls).
            with owning(attempt.ownership):
                result = await super().execute_activity(input)
            outcome = "completed"
            return result
        except temporalio.activity._CompleteAsyncError:
            outcome = None
            raise
        except (asyncio.CancelledError, temporalio.exceptions.CancelledError):
            outcome = "cancelled"
            raise
        except BaseException as exc:
            error = type(exc).__name__[:_LABEL]
            raise
        finally:
            attempt.end(outcome, error)


class SplitbrainInterceptor(Interceptor):
    """Activity attempts as leases: `lease_acquired` at the start (a coordinator's, for a
    server-scheduled attempt), `heartbeat` (at the SDK's own throttle), `lease_lost` when the
    server cancels the attempt as not found, timed out, reset or paused, `ownership_uncertain`
    when the attempt's heartbeat or start-to-close timeout passes by the worker's clock, and
    `lease_released` at the end. Never raises into the activity; Kafka down is counted drops."""

    def __init__(self, sink: AdapterSink | None = None, *, worker_id: str | None = None) -> None:
        """`worker_id`: the worker's identity (`client.identity`; by default Temporal's own
        default, pid@host). It must be given here: `activity.client()` is not available in a
        synchronous activity. `sink` defaults to one configured by `SPLITBRAIN_*` variables."""
        self.sink = sink if sink is not None else AdapterSink(ADAPTER)
        self.worker_id = (worker_id or f"{os.getpid()}@{socket.gethostname()}")[:256]

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self)

    def _begin(self) -> _Attempt | None:
        try:
            attempt = _Attempt(temporalio.activity.info(), self.sink, self.worker_id)
        except Exception:
            log.exception("temporal adapter: the attempt could not be read")
            return None
        attempt.start()
        return attempt
