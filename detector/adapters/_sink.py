"""A sink for events made inside someone else's worker: it never blocks, slows or fails it.

The host's thread only appends the event's fields to a bounded queue (a `deque.append`); a
daemon thread validates and publishes them through `detector.kafka.emit.Emitter`. When Kafka is
down the emitter's own buffer fills, then this queue, and what does not fit is dropped and
counted (`splitbrain_adapter_events_dropped_total{adapter,reason}`), never raised: a detector
that stops the fleet it watches would be worse than one that misses an event. Forked children
(Celery's prefork pool) start their own thread and drop the parent's queue, which the parent
still sends.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Protocol
from uuid import uuid4

import msgspec
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from detector.contracts.events import EventError, Kind, OwnershipEvent, parse_event_json

log = logging.getLogger(__name__)

DEFAULT_CAPACITY: Final = 10_000
_IDLE_WAIT_S: Final = 1.0
# The host's fields as JSON (datetimes in RFC 3339, enums by value), at a tenth of pydantic's cost
_ENCODE: Final = msgspec.json.Encoder().encode
_SETTLE_S: Final = 5.0  # a wait for Kafka's acknowledgements, between bursts of events
_FINAL_SETTLE_S: Final = 1.0  # at close, after `flush` already waited
_RETRY_S: Final = 1.0  # after the emitter could not be made or failed: try again this late


class DropReason(StrEnum):
    """The values of the `reason` label."""

    QUEUE_FULL = "queue_full"  # the host made events faster than Kafka took them
    INVALID = "invalid"  # not a valid event (logged with its workflow key and field)
    KAFKA = "kafka"  # the emitter could not be made, or Kafka refused the event
    CLOSED = "closed"  # sent after `close`, or still queued when it gave up


class Publisher(Protocol):
    """What the sink needs of `Emitter`."""

    def publish(self, event: OwnershipEvent, value: bytes) -> None: ...

    def flush(self, timeout: float = ...) -> None: ...

    def close(self) -> None: ...


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.dropped = Counter(
            "splitbrain_adapter_events_dropped",
            "Events an adapter made but did not publish, by reason (the host never waits)",
            ["adapter", "reason"],
            registry=registry,
        )
        self.sent = Counter(
            "splitbrain_adapter_events_sent",
            "Events an adapter handed to the Kafka producer",
            ["adapter"],
            registry=registry,
        )


_metrics: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()
_metrics_lock = threading.Lock()


def _metrics_of(registry: CollectorRegistry) -> _Metrics:
    """One set of counters per registry, however many sinks share it."""
    with _metrics_lock:
        found = _metrics.get(registry)
        if found is None:
            found = _metrics[registry] = _Metrics(registry)
        return found


def _from_env() -> Publisher:
    from detector.kafka.emit import Emitter  # noqa: PLC0415  (confluent-kafka, at first send)

    return Emitter.from_env()


_sinks: weakref.WeakSet[AdapterSink] = weakref.WeakSet()


class _EventIds:
    """Unique event ids without a system call per event (`uuid4` reads os.urandom each time):
    a random prefix per process, drawn again in a forked child, and a counter."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._prefix = uuid4().hex[:20]
        self._count = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count):x}"


_event_id = _EventIds()


class AdapterSink:
    """Queue events from host code; publish them from a thread of its own."""

    def __init__(
        self,
        adapter: str,
        *,
        publisher: Callable[[], Publisher] = _from_env,
        capacity: int = DEFAULT_CAPACITY,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`publisher` makes the emitter, in the sender thread (default: `Emitter.from_env`,
        configured by the `SPLITBRAIN_*` variables)."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.adapter = adapter
        self._make = publisher
        self._capacity = capacity
        m = _metrics_of(REGISTRY if registry is None else registry)
        self._dropped = {r: m.dropped.labels(adapter, r.value) for r in DropReason}
        self._sent = m.sent.labels(adapter)
        self._queue: deque[dict[str, Any]] = deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._sleeping = False  # the sender waits on `_wake` (set before its last look)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        _sinks.add(self)

    # ---- the host's side: never raises, never waits ------------------------------------------

    def send(self, kind: Kind | str, **fields: Any) -> None:
        """Queue one event (`fields` as `Emitter.emit` takes them). Costs the caller a few
        microseconds; whatever goes wrong later is counted, not raised."""
        try:
            if self._closed:
                self._dropped[DropReason.CLOSED].inc()
                return
            if len(self._queue) >= self._capacity:
                self._dropped[DropReason.QUEUE_FULL].inc()
                return
            fields["kind"] = kind
            if "event_id" not in fields:
                fields["event_id"] = _event_id()
            fields.setdefault("observed_at", datetime.now(UTC))
            self._queue.append(fields)
            if self._idle.is_set():  # after the append: the sender re-checks the queue once idle
                self._idle.clear()
            if self._thread is None or self._pid != os.getpid():
                self._start()
            if self._sleeping:  # else the sender is busy and finds the event itself
                self._wake.set()
        except Exception:  # the host's task must never see our failure
            log.exception("adapter %s: an event could not be queued", self.adapter)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event is handed to the producer and the producer has waited
        for Kafka's acknowledgements once (tests, shutdown). True when that happened in time."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        return self._idle.wait(max(deadline - time.monotonic(), 0.0))

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued within `timeout`, then stop; the rest counts as dropped."""
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout + _FINAL_SETTLE_S)
        left = len(self._queue)
        self._queue.clear()
        if left:
            self._dropped[DropReason.CLOSED].inc(left)

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ---- the sender thread ---------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=self._run, name=f"splitbrain-{self.adapter}", daemon=True
            )
            self._thread.start()

    def _after_fork(self) -> None:
        """In a forked child: the parent's queue is the parent's to send; start afresh."""
        self._queue.clear()
        self._thread = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._sleeping = False

    def _run(self) -> None:
        publisher: Publisher | None = None
        unsettled = False  # published since the last wait for acknowledgements
        while True:
            if not self._queue:
                if self._closed:
                    break
                if publisher is not None and unsettled:
                    self._settle(publisher, _SETTLE_S)
                    unsettled = False
                if not self._queue:
                    self._idle.set()
                    self._sleeping = True  # before the last look: a later append wakes us
                    if self._queue:  # appended while idle was being set
                        self._sleeping = False
                        self._idle.clear()
                        continue
                    self._wake.wait(_IDLE_WAIT_S)
                    self._sleeping = False
                    self._wake.clear()
                    continue
            if publisher is None:
                publisher = self._connect()
                if publisher is None:
                    continue
            publisher = self._publish(publisher, self._queue.popleft())
            unsettled = True
        if publisher is not None:
            self._settle(publisher, _FINAL_SETTLE_S, final=True)
            publisher.close()
        self._idle.set()

    def _connect(self) -> Publisher | None:
        try:
            return self._make()
        except Exception as exc:
            dropped = len(self._queue)
            self._queue.clear()
            self._dropped[DropReason.KAFKA].inc(dropped)
            log.warning(
                "adapter %s: no Kafka producer (%s); %d event(s) dropped",
                self.adapter,
                type(exc).__name__,
                dropped,
            )
            time.sleep(_RETRY_S)
            return None

    def _publish(self, publisher: Publisher, fields: Mapping[str, Any]) -> Publisher | None:
        try:
            value = _ENCODE(fields)
            event = parse_event_json(value)  # the detector's own reading of these bytes
        except (EventError, TypeError) as exc:
            self._dropped[DropReason.INVALID].inc()
            log.warning(
                "adapter %s: invalid event for workflow %r dropped: %s",
                self.adapter,
                str(fields.get("workflow_key"))[:512],
                exc,
            )
            return publisher
        if event.dropped_fields:
            # Sent without them, as a detector would read it; the host's code can fix them.
            log.warning(
                "adapter %s: event for workflow %r sent without %s",
                self.adapter,
                event.workflow_key,
                ", ".join(f"{d.field} ({d.reason})" for d in event.dropped_fields),
            )
            value = event.model_dump_json(exclude_none=True).encode("utf-8")
        try:
            publisher.publish(event, value)
            self._sent.inc()
            return publisher
        except Exception as exc:
            self._dropped[DropReason.KAFKA].inc()
            log.warning("adapter %s: event not published (%s)", self.adapter, type(exc).__name__)
            publisher.close()
            return None

    def _settle(self, publisher: Publisher, timeout: float, *, final: bool = False) -> None:
        """Between bursts: wait for Kafka's acknowledgements, counting the events it refused;
        at the end, also those it never acknowledged (closing the producer discards them)."""
        try:
            publisher.flush(timeout)
        except Exception as exc:
            failures = getattr(exc, "failures", None)
            if failures:
                self._dropped[DropReason.KAFKA].inc(len(failures))
            pending = getattr(exc, "pending", 0)
            if final and pending:
                self._dropped[DropReason.CLOSED].inc(pending)
            log.warning("adapter %s: Kafka did not take events (%s)", self.adapter, exc)


def _reset_after_fork() -> None:
    _event_id.reset()
    for sink in list(_sinks):
        sink._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
