"""Celery: the zombie of an `acks_late` task redelivered while its first delivery still runs.

`install(app)` connects signal handlers; nothing in the tasks changes. Per delivery of a task
(key: the task id, the task's name in `attrs`):

- `task_received` (the worker's main process, which sees the broker's message) fixes the epoch
  and the moment of receipt, and hands both to the pool in the request's headers;
- `task_prerun` emits the acquisition, makes the task's effect calls
  (`detector.adapters.effect_committed`, …) carry its key and epoch, and, for an `acks_late`
  task on a broker with a visibility timeout, arms a timer that emits `ownership_uncertain` once
  the broker may have handed the message to another worker;
- `task_postrun` emits `lease_released` (with the task's state) and ends all of that;
- `task_revoked` with `terminated` and a `task_failure` raised in the main process (the pool's
  child died: a hard time limit, an OOM kill) emit the `lease_released` the child never could.

Every event of a delivery, the task's effect calls included, says in Celery's words which
delivery it is (DESIGN §5 `context`, `delivery_words`): the task's name (`attrs`), whether the
broker marked it redelivered, its retries, the visibility timeout it runs under, and, once it
outlived that timeout by the worker's clock, `outlived=visibility_timeout`.

The epoch, and its authority (DESIGN §4: none is claimed that the source does not have):
SQS's `ApproximateReceiveCount` and RabbitMQ quorum queues' `x-delivery-count` come from the
broker (approximate, never fenced on); elsewhere (Redis, classic queues) the adapter mints one
(`Minter`: 1 for a first delivery, then an atomic INCR per task id on a Redis server).
`task.request.retries` is no epoch: a redelivery does not change it.

Never harms the host: each handler catches everything; events go through `AdapterSink`; the
only call that can wait is the INCR, bounded by `redis_timeout_s` and made in the main process
at receipt, not in the task. A `task_rejected` message never became a task, so it has no owner:
nothing to report.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, ParamSpec

from celery import Celery, signals
from celery.app.task import Task

from detector.contracts.events import Kind

from ._context import Authority, Ownership, enter, leave, words
from ._sink import AdapterSink

log = logging.getLogger(__name__)

ADAPTER: Final = "celery"
TASK_ATTR: Final = "task_name"
EPOCH_TTL_S: Final = 7 * 24 * 3600  # a minted counter outlives any redelivery of its task
KEY_PREFIX: Final = "splitbrain:celery:epoch:"
# The Redis and SQS transports redeliver an unacknowledged message after this long by default.
DEFAULT_VISIBILITY_S: Final = {"redis": 3600.0, "rediss": 3600.0, "sqs": 1800.0}
_RECEIVED_KEEP: Final = 10_000  # the main process's memory of epochs, for the child's death
# Added to the request's headers at receipt: the pool's child reads them in `task.request`.
_EPOCH: Final = "splitbrain_epoch"
_AUTHORITY: Final = "splitbrain_epoch_authority"
_FROM: Final = "splitbrain_epoch_from"
_RECEIVED_AT: Final = "splitbrain_received_at"
_REDELIVERED: Final = "splitbrain_redelivered"

_P = ParamSpec("_P")


def _guarded(handler: Callable[_P, None]) -> Callable[_P, None]:
    """A signal handler that never raises into Celery (and so into the task)."""

    @functools.wraps(handler)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            handler(*args, **kwargs)
        except Exception:
            log.exception("celery adapter: %s failed; the task is not affected", handler.__name__)

    return wrapper


class Epoch(NamedTuple):
    value: int
    authority: Authority
    source: str  # the `epoch_from` attribute


MINTED_FROM: Final = "redis.incr"
FLAG_FROM: Final = "celery.redelivered"  # without Redis: 1, or 2 for any later delivery


class Minter:
    """An epoch per task id that only grows (minted, advisory): 1 for the task's first delivery,
    then 1 + `INCR` on a Redis server for each later one (a redelivery or a retry). The first
    delivery, by far the most common, costs no round trip: the broker marks every redelivery
    (Redis's restore of an unacknowledged message, AMQP's requeue) and a retry counts itself."""

    def __init__(self, url: str | None, timeout_s: float) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._client: Any = None
        self._warned = False

    def mint(self, task_id: str, redelivered: bool, retries: int) -> Epoch:
        """The epoch of this delivery of `task_id`; without Redis, 1 for a first delivery and
        2 for a later one (weaker still, and said so in `epoch_from`)."""
        if not redelivered and not retries:
            return Epoch(1, Authority.MINTED, FLAG_FROM if self.url is None else MINTED_FROM)
        if self.url is not None:
            try:
                pipe = self._redis().pipeline(transaction=False)  # INCR is atomic alone
                pipe.incr(KEY_PREFIX + task_id)
                pipe.expire(KEY_PREFIX + task_id, EPOCH_TTL_S)
                value, _ = pipe.execute()
                return Epoch(int(value) + 1, Authority.MINTED, MINTED_FROM)
            except Exception as exc:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "celery adapter: no epoch from Redis (%s); using the redelivered flag",
                        type(exc).__name__,
                    )
        return Epoch(2, Authority.MINTED, FLAG_FROM)

    def _redis(self) -> Any:
        if self._client is None:
            import redis  # noqa: PLC0415  (the celery extra's)

            assert self.url is not None
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s
            )
        return self._client


def broker_epoch(message: Any, *, quorum: bool) -> Epoch | None:
    """The broker's own delivery count of `message`, where it keeps one."""
    info = getattr(message, "delivery_info", None) or {}
    sqs = info.get("sqs_message")
    if isinstance(sqs, Mapping):
        count = (sqs.get("Attributes") or {}).get("ApproximateReceiveCount")
        if count is not None:
            return Epoch(int(count), Authority.APPROXIMATE, "sqs.approximate_receive_count")
    if quorum:
        # Absent on a first delivery; 1 on the first redelivery.
        count = (getattr(message, "headers", None) or {}).get("x-delivery-count", 0)
        return Epoch(int(count) + 1, Authority.APPROXIMATE, "rabbitmq.x_delivery_count")
    return None


class Watchdog:
    """One thread per process that calls each armed callback at its time, unless disarmed
    first. The task's thread only pushes onto a heap (dropping the ended tasks' timers from its
    top), and wakes the thread only for a time sooner than the one it sleeps until."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._armed: set[int] = set()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._until = math.inf  # when the thread wakes next, unless woken
        self._pid = -1

    def arm(self, at: float, callback: Callable[[], None]) -> int:
        """Call `callback` at `at` (time.monotonic()); the handle disarms it."""
        handle = next(self._ids)
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: a thread of its own
                self._pid = os.getpid()
                self._heap.clear()
                self._armed.clear()
                self._until = math.inf
                threading.Thread(
                    target=self._run, name="splitbrain-celery-timer", daemon=True
                ).start()
            while self._heap and self._heap[0][1] not in self._armed:
                heapq.heappop(self._heap)
            heapq.heappush(self._heap, (at, handle, callback))
            self._armed.add(handle)
            sooner = at < self._until
        if sooner:
            self._wake.set()
        return handle

    def disarm(self, handle: int) -> None:
        with self._lock:
            self._armed.discard(handle)

    def _run(self) -> None:
        while True:
            with self._lock:
                due: list[Callable[[], None]] = []
                now = time.monotonic()
                while self._heap and (
                    self._heap[0][0] <= now or self._heap[0][1] not in self._armed
                ):
                    _, handle, callback = heapq.heappop(self._heap)
                    if handle in self._armed:
                        self._armed.discard(handle)
                        due.append(callback)
                self._until = self._heap[0][0] if self._heap else math.inf
                wait = self._until - now if self._heap else None
            for callback in due:
                try:
                    callback()
                except Exception:
                    log.exception("celery adapter: a timer failed")
            self._wake.wait(wait)
            self._wake.clear()


@dataclass(slots=True)
class _Running:
    ownership: Ownership
    token: Token[Ownership | None]  # the task's effect calls carry its ownership until reset
    timer: int | None


class CeleryAdapter:
    """The handlers `install` connects; `uninstall` disconnects them."""

    def __init__(
        self,
        app: Celery,
        sink: AdapterSink,
        *,
        epoch_redis_url: str | None,
        quorum_queues: bool,
        worker_id: str | None,
        redis_timeout_s: float,
    ) -> None:
        self.app = app
        self.sink = sink
        self.quorum_queues = quorum_queues
        self.worker_id = worker_id
        self.hostname = socket.gethostname()  # where the request names no worker (`apply`)
        self.minter = Minter(epoch_redis_url, redis_timeout_s)
        self.visibility_s = visibility_timeout(app)
        self.watchdog = Watchdog()
        self._running: dict[str, _Running] = {}
        self._received: OrderedDict[str, tuple[Epoch, str, str]] = OrderedDict()
        self._handlers: list[tuple[Any, Callable[..., None]]] = [
            (signals.task_received, self._on_received),
            (signals.task_prerun, self._on_prerun),
            (signals.task_postrun, self._on_postrun),
            (signals.task_revoked, self._on_revoked),
            (signals.task_failure, self._on_failure),
            (signals.worker_process_shutdown, self._on_process_shutdown),
        ]
        os.register_at_fork(after_in_child=self._received.clear)

    def connect(self) -> None:
        for signal, handler in self._handlers:
            signal.connect(handler, weak=False, dispatch_uid=self._uid(handler))

    def uninstall(self) -> None:
        for signal, handler in self._handlers:
            signal.disconnect(handler, dispatch_uid=self._uid(handler))

    def _uid(self, handler: Callable[..., None]) -> str:
        """One receiver per adapter and handler: Celery 5.6 keys a bound method by its function
        alone, so a second app's adapter would not be connected at all."""
        return f"splitbrain-celery-{id(self)}-{handler.__name__}"

    # -- the main process ----------------------------------------------------------------------

    @_guarded
    def _on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is None or request.task.app is not self.app:
            return
        message = request.message
        redelivered = bool(request.delivery_info.get("redelivered"))
        epoch = broker_epoch(message, quorum=self.quorum_queues) or self.minter.mint(
            request.id, redelivered, int(request.request_dict.get("retries") or 0)
        )
        headers = request.request_dict
        # A broker's own count says it too (SQS sets no flag): a later delivery is a redelivery.
        headers[_REDELIVERED] = redelivered or (
            epoch.authority is Authority.APPROXIMATE and epoch.value > 1
        )
        headers[_EPOCH] = epoch.value
        headers[_AUTHORITY] = epoch.authority.value
        headers[_FROM] = epoch.source
        headers[_RECEIVED_AT] = time.time()
        self._received[request.id] = (epoch, request.hostname or self.hostname, request.name)
        while len(self._received) > _RECEIVED_KEEP:
            self._received.popitem(last=False)

    @_guarded
    def _on_revoked(
        self, sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
    ) -> None:
        if terminated and request is not None:
            self._child_gone(str(request.id), "revoked")

    @_guarded
    def _on_process_shutdown(self, **_: Any) -> None:
        """A prefork pool's child ends with `os._exit`, which runs no `atexit`: its events are
        sent here, within the exit's bound, as any process's exit sends them."""
        self.sink.flush_at_exit()

    @_guarded
    def _on_failure(
        self, sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
    ) -> None:
        # In the child, postrun follows and reports; in the main process the child is gone.
        if task_id is not None and task_id not in self._running:
            self._child_gone(task_id, type(exception).__name__)

    def _child_gone(self, task_id: str, why: str) -> None:
        found = self._received.pop(task_id, None)
        if found is None:
            return
        epoch, worker, name = found
        Ownership(
            self.sink,
            task_id,
            epoch.value,
            self.worker_id or worker,
            epoch.authority,
            epoch.source,
            {TASK_ATTR: name},
        ).emit(Kind.LEASE_RELEASED, detail={"state": "ended", "reason": why})

    # -- the pool's child: around the task ------------------------------------------------------

    @_guarded
    def _on_prerun(
        self, sender: Any = None, task_id: str | None = None, task: Task | None = None, **_: Any
    ) -> None:
        if task is None or task_id is None or task.app is not self.app:
            return
        req = task.request
        value = req.get(_EPOCH)
        redelivered = req.get(_REDELIVERED)
        if redelivered is None:
            redelivered = bool((req.delivery_info or {}).get("redelivered"))
        if value is None:  # not through a worker's consumer (`apply`, eager mode)
            epoch = self.minter.mint(task_id, redelivered, int(req.retries or 0))
        else:
            epoch = Epoch(int(value), Authority(req.get(_AUTHORITY)), str(req.get(_FROM)))
        acks_late = bool(req.get("acks_late", task.acks_late))
        visibility = self.visibility_s if acks_late else None
        ownership = Ownership(
            self.sink,
            task_id,
            epoch.value,
            self.worker_id or req.hostname or self.hostname,
            epoch.authority,
            epoch.source,
            {TASK_ATTR: task.name},
            delivery_words(bool(redelivered), int(req.retries or 0), visibility),
        )
        if visibility is None:
            ownership.acquired()
        else:
            ownership.acquired(lease_duration_s=visibility)
        timer = None
        if visibility is not None:
            received = req.get(_RECEIVED_AT) or time.time()
            at = time.monotonic() + max(float(received) + visibility - time.time(), 0.0)
            timer = self.watchdog.arm(at, functools.partial(self._uncertain, ownership))
        self._running[task_id] = _Running(ownership, enter(ownership), timer)

    def _uncertain(self, ownership: Ownership) -> None:
        # By the worker's clock, the broker may now hand the message to another worker: the
        # task's later effects say it outlived the visibility timeout.
        ownership.note(outlived="visibility_timeout")
        ownership.emit(
            Kind.OWNERSHIP_UNCERTAIN,
            detail={"reason": "visibility_timeout", "visibility_timeout_s": self.visibility_s},
        )

    @_guarded
    def _on_postrun(
        self,
        sender: Any = None,
        task_id: str | None = None,
        task: Task | None = None,
        state: str | None = None,
        **_: Any,
    ) -> None:
        if task is not None and task.app is not self.app:  # another app's delivery of the id
            return
        running = self._running.pop(task_id, None) if task_id is not None else None
        if running is None:
            return
        if running.timer is not None:
            self.watchdog.disarm(running.timer)
        running.ownership.emit(Kind.LEASE_RELEASED, detail={"state": state or "unknown"})
        leave(running.token)


def delivery_words(redelivered: bool, retries: int, visibility_s: float | None) -> dict[str, Any]:
    """A delivery in Celery's words (DESIGN §5 `context`), with the task's name in `attrs`:
    whether the broker marked it redelivered (kombu's `delivery_info['redelivered']`: Redis
    restores an unacknowledged message once the visibility timeout passes, or when a worker
    shuts down; AMQP requeues when a consumer's channel closes), the task's own retry count,
    and the visibility timeout an `acks_late` delivery runs under."""
    return words(
        redelivered=redelivered,
        retries=retries or None,
        visibility_timeout_s=visibility_s,
    )


def visibility_timeout(app: Celery) -> float | None:
    """How long the broker waits for an acknowledgement before it redelivers a message: the
    transport option, else the transport's default; None where there is none (AMQP)."""
    options = app.conf.broker_transport_options or {}
    if "visibility_timeout" in options:
        return float(options["visibility_timeout"])
    scheme = str(app.conf.broker_url or "").partition("://")[0].partition("+")[0]
    return DEFAULT_VISIBILITY_S.get(scheme)


def _redis_url(app: Celery) -> str | None:
    for url in (app.conf.broker_url, app.conf.result_backend):
        if isinstance(url, str) and url.startswith(("redis://", "rediss://")):
            return url
    return None


def install(
    app: Celery,
    *,
    sink: AdapterSink | None = None,
    epoch_redis_url: str | None = None,
    quorum_queues: bool = False,
    worker_id: str | None = None,
    redis_timeout_s: float = 0.5,
) -> CeleryAdapter:
    """Report `app`'s task deliveries to splitbrain (call it where the app is made, so that the
    worker's processes import it). `epoch_redis_url` is where epochs are minted (default: the
    broker's or the result backend's Redis); `quorum_queues` says the RabbitMQ queues are quorum
    queues, whose `x-delivery-count` is then the epoch; `sink` defaults to one configured by the
    `SPLITBRAIN_*` variables."""
    adapter = CeleryAdapter(
        app,
        sink if sink is not None else AdapterSink(ADAPTER),
        epoch_redis_url=epoch_redis_url or _redis_url(app),
        quorum_queues=quorum_queues,
        worker_id=worker_id,
        redis_timeout_s=redis_timeout_s,
    )
    adapter.connect()
    return adapter
