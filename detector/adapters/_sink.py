"""A sink for events made inside someone else's worker: it never blocks, slows or fails it.

The host's thread only appends the event's fields to a bounded queue (a `deque.append`); a
daemon thread encodes and publishes them through `detector.kafka.emit.Emitter`, in batches: once
woken it lingers a few milliseconds and takes everything queued, and while events keep coming it
is never woken by the host at all (a wake-up costs the host more than an event). An event an
adapter built (`send_owned`: an owner's shared fields and its own, merged in the sender) and
any other (`send`, the user's effect calls) are validated alike, by the detector's own reading
of its JSON (the contract's pydantic model), in the sender thread. When Kafka is
down the emitter's own buffer fills, then this queue, and what does not fit is dropped and
counted (`splitbrain_adapter_events_dropped_total{adapter,reason}`), never raised: a detector
that stops the fleet it watches would be worse than one that misses an event. Forked children
(Celery's prefork pool) start their own thread and drop the parent's queue, which the parent
still sends.

At the process's exit (`atexit`: a script, a job, a pod that resumes one interrupt and ends) the
sinks of the process send what they hold and wait for Kafka's acknowledgements, all together
within one bound (`SPLITBRAIN_ADAPTER_EXIT_FLUSH_S`, 5 s); whatever is still unsent then is
counted (`reason="exit"`) and logged in one line per sink. The exit never waits longer, and
nothing raises into it. An event sent once a sink is closed (work that outlived its sink) is
counted and logged too: the first at once, later ones summed into a line at most every
`_LATE_LOG_EVERY_S` and at exit.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import os
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Protocol
from uuid import uuid4

import msgspec
from prometheus_client import REGISTRY, CollectorRegistry, Counter
from pydantic import Field

from detector.contracts.events import (
    MAX_KEY_CHARS,
    EventError,
    Kind,
    OwnershipEvent,
    parse_event_json,
)
from detector.errors import SplitbrainError
from detector.settings import CommandSettings, Seconds, SettingsError, env_var

from ._handoff import Handoff

log = logging.getLogger(__name__)

DEFAULT_CAPACITY: Final = 10_000
DEFAULT_LINGER_S: Final = 0.02  # after a wake-up, before taking the batch: what an event may wait
_IDLE_WAIT_S: Final = 1.0
# The host's fields as JSON (datetimes in RFC 3339, enums by value), at a tenth of pydantic's cost
_ENCODE: Final = msgspec.json.Encoder().encode
_SETTLE_S: Final = 5.0  # a wait for Kafka's acknowledgements, between bursts of events
_FINAL_SETTLE_S: Final = 1.0  # at close, after `flush` already waited
_RETRY_S: Final = 1.0  # after the emitter could not be made or failed: try again this late
DEFAULT_EXIT_FLUSH_S: Final = 5.0
_LATE_LOG_EVERY_S: Final = 60.0  # events sent to a closed sink: one summed line this often
# Where the docs say how to configure the producer, for a log line that cannot name a variable.
_CONFIGURATION: Final = (
    f"the producer is configured by {env_var('bootstrap_servers')} and the other SPLITBRAIN_* "
    "variables (docs/operating/security.md)"
)


class SinkSettings(CommandSettings):
    """The sink's settings, from the host process's `SPLITBRAIN_*` variables (an adapter runs
    in someone else's process, with no command line of ours)."""

    adapter_exit_flush_s: Seconds = Field(
        DEFAULT_EXIT_FLUSH_S,
        description="at the exit of a process whose adapters made events, how long it may "
        "still wait for them to be sent and acknowledged by Kafka (every sink of the process "
        "at once), in seconds; what is still unsent then is counted in "
        '`splitbrain_adapter_events_dropped_total{reason="exit"}` and logged. 0: no wait',
    )


def _exit_flush_s() -> float:
    """The exit's bound from the environment; a bad value is logged and the default used (an
    adapter never stops the host's process over a setting of ours)."""
    try:
        return SinkSettings.from_env().adapter_exit_flush_s
    except SettingsError as exc:
        log.warning(
            "adapter sink: %s; flushing at exit within %gs instead",
            "; ".join(str(exc).splitlines()),
            DEFAULT_EXIT_FLUSH_S,
        )
        return DEFAULT_EXIT_FLUSH_S


class DropReason(StrEnum):
    """The values of the `reason` label."""

    QUEUE_FULL = "queue_full"  # the host made events faster than Kafka took them
    INVALID = "invalid"  # not a valid event (logged with its workflow key and field)
    KAFKA = "kafka"  # the emitter could not be made, or Kafka refused the event
    CLOSED = "closed"  # sent after `close`, or still queued when it gave up
    EXIT = "exit"  # still unsent (queued, or not acknowledged by Kafka) when the process exited


class Publisher(Protocol):
    """What the sink needs of `Emitter`. One that also has `publish_json(workflow_key, value)`
    (as `Emitter` does) is given every event that way, without it parsed again."""

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


_PROPERTY: Final = re.compile(r'property "([a-z.]+)"')


def _unavailable(exc: Exception, *, from_env: bool) -> str:
    """Why there is no producer, saying what to set. The project's own errors name the variable
    (`SPLITBRAIN_BOOTSTRAP_SERVERS is not set (...)`); librdkafka's name a setting, whose
    variable is added; any other is named by its class and text. For the producer the variables
    configure, a reason that names no variable is followed by where they are described."""
    # confluent-kafka, imported at the first send, not with the adapters.
    from confluent_kafka import KafkaException  # noqa: PLC0415

    from detector.kafka.config import KafkaConnection, describe, env_name  # noqa: PLC0415

    if isinstance(exc, SplitbrainError):
        reason = "; ".join(str(exc).splitlines())
    elif isinstance(exc, KafkaException):
        reason = describe(exc)
        setting = _PROPERTY.search(reason)
        if from_env and setting and setting[1].replace(".", "_") in KafkaConnection.model_fields:
            reason += f": set {env_name(setting[1])}"
    else:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if from_env and "SPLITBRAIN_" not in reason:
        reason += f" ({_CONFIGURATION})"
    return reason


class _LateDrops:
    """Events sent to a closed sink, said without flooding the host's log (work that keeps
    sending once its sink closed would write a line per event): the first at once, later ones
    summed into a line at most every `_LATE_LOG_EVERY_S`, and what is left at exit
    (`_flush_at_exit`). Counts only: never an event's contents."""

    def __init__(self, adapter: str) -> None:
        self._adapter = adapter
        self._lock = threading.Lock()
        self._unsaid: dict[DropReason, int] = {}
        self._said_at: float | None = None

    def add(self, reason: DropReason) -> None:
        now = time.monotonic()
        with self._lock:
            self._unsaid[reason] = self._unsaid.get(reason, 0) + 1
            if self._said_at is not None and now - self._said_at < _LATE_LOG_EVERY_S:
                return
            first = self._said_at is None
            self._said_at = now
            unsaid, self._unsaid = self._unsaid, {}
        if first:
            _hook_exit()  # a sink closed before it ever sent has no hook yet
        self._say(unsaid, first=first)

    def report(self) -> None:
        """At exit: what was summed since the last line."""
        with self._lock:
            unsaid, self._unsaid = self._unsaid, {}
        self._say(unsaid, first=False)

    def _say(self, unsaid: Mapping[DropReason, int], *, first: bool) -> None:
        for reason, count in unsaid.items():
            log.warning(
                "adapter %s: %d event(s) sent after %s, dropped (counted, reason %s)%s",
                self._adapter,
                count,
                "the process's exit began"
                if reason is DropReason.EXIT
                else "its sink was closed: the work outlived the sink's close",
                reason.value,
                f"; later ones are summed here every {_LATE_LOG_EVERY_S:g}s and at exit"
                if first
                else "",
            )


_sinks: weakref.WeakSet[AdapterSink] = weakref.WeakSet()
_exit_hook = threading.Lock()
_exit_hooked = False


def _hook_exit() -> None:
    """Register the exit's flush once for the process (and for a forked child, which inherits
    it), at the first sink's first event: one hook for every sink, held weakly in `_sinks`."""
    global _exit_hooked  # noqa: PLW0603  (one registration per process)
    with _exit_hook:
        if not _exit_hooked:
            atexit.register(_flush_at_exit)
            _exit_hooked = True


def _flush_at_exit(of: Iterable[AdapterSink] | None = None) -> None:
    """`atexit`: every sink of this process sends what it holds, all within one bound (each
    sink's `exit_flush_s` from the same start, so never their sum). Upstream stages first
    (LangGraph's ledger, whose records become events), then every sink is told at once, then
    each is waited for and what it could not send is counted and logged. Never raises. `of`:
    these sinks rather than all of the process's (tests)."""
    try:
        start = time.monotonic()
        for sink in list(_sinks if of is None else of):
            sink._flush_upstream(start + sink.exit_flush_s)
        sinks = [sink for sink in list(_sinks if of is None else of) if sink._running_here()]
        for sink in sinks:
            sink._begin_exit(start + sink.exit_flush_s)
        for sink in sinks:
            sink._finish_exit()
        for sink in list(_sinks if of is None else of):
            sink._late.report()
    except Exception:  # the host's exit must never see our failure
        log.exception("adapter sink: flushing at exit failed")


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


def owner_fields(
    workflow_key: str, owner_epoch: int, worker_id: str, attrs: dict[str, str]
) -> dict[str, Any]:
    """The fields every event of one owner shares (`attrs` becomes theirs), built once; each
    event is checked against the contract when it is sent."""
    return {
        "workflow_key": workflow_key,
        "owner_epoch": owner_epoch,
        "worker_id": worker_id,
        "attrs": attrs,
    }


# A queued event: the fields of `send`, or (owner fields, kind, own fields, time.time()) of
# `send_owned`.
_Owned = tuple[Mapping[str, Any], Kind, dict[str, Any], float]
_Queued = dict[str, Any] | _Owned


class AdapterSink:
    """Queue events from host code; publish them from a thread of its own."""

    def __init__(
        self,
        adapter: str,
        *,
        publisher: Callable[[], Publisher] = _from_env,
        capacity: int = DEFAULT_CAPACITY,
        registry: CollectorRegistry | None = None,
        linger_s: float = DEFAULT_LINGER_S,
        exit_flush_s: float | None = None,
    ) -> None:
        """`publisher` makes the emitter, in the sender thread (default: `Emitter.from_env`,
        configured by the `SPLITBRAIN_*` variables); `linger_s` is how long the sender waits
        for more events once woken (what an event may wait, against wake-ups per event);
        `exit_flush_s` how long the process's exit may wait for this sink's events to be sent
        and acknowledged (default: `SPLITBRAIN_ADAPTER_EXIT_FLUSH_S`, else 5 s)."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        if not 0 <= linger_s <= 1:
            raise ValueError(f"linger_s must be between 0 and 1 second, not {linger_s}")
        if exit_flush_s is None:
            exit_flush_s = _exit_flush_s()
        elif not 0 <= exit_flush_s < math.inf:
            raise ValueError(f"exit_flush_s must be 0 or more seconds, not {exit_flush_s}")
        self.adapter = adapter
        self.exit_flush_s = exit_flush_s
        self._make = publisher
        self._capacity = capacity
        self._linger_s = linger_s
        m = _metrics_of(REGISTRY if registry is None else registry)
        self._dropped = {r: m.dropped.labels(adapter, r.value) for r in DropReason}
        self._sent = m.sent.labels(adapter)
        self._queue: deque[_Queued] = deque()
        self._handoff = Handoff()
        self._closed = False
        self._close_by = 0.0  # time.monotonic() a `close` waits for Kafka until
        self._closed_reason = DropReason.CLOSED  # what an event sent once closed counts as
        self._late = _LateDrops(adapter)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._upstream: list[weakref.WeakMethod[Callable[[float], bool]]] = []
        self._reset_exit()
        _sinks.add(self)

    def _reset_exit(self) -> None:
        self._deadline: float | None = None  # time.monotonic() the sender's waits end by (exit)
        self._publisher: Publisher | None = None  # the sender's, for the exit to count its events
        self._exit_lock = threading.Lock()
        self._accounted = False  # the sender counted what it left (`_unsent`)
        self._abandoned = False  # the exit's bound passed first: it counted, the sender must not
        self._unsent = 0
        self._holding = 0  # an event the sender took from the queue and has not yet published

    # ---- the host's side: never raises, never waits ------------------------------------------

    def send(self, kind: Kind | str, **fields: Any) -> None:
        """Queue one event (`fields` as `Emitter.emit` takes them), validated before it is
        sent. Costs the caller a few microseconds; whatever goes wrong later is counted, not
        raised."""
        try:
            fields["kind"] = kind
            if "event_id" not in fields:
                fields["event_id"] = _event_id()
            fields.setdefault("observed_at", datetime.now(UTC))
            self._put(fields)
        except Exception:  # the host's task must never see our failure
            log.exception("adapter %s: an event could not be queued", self.adapter)

    def send_owned(self, owner: Mapping[str, Any], kind: Kind, fields: dict[str, Any]) -> None:
        """Queue one event an adapter built: `owner` from `owner_fields`, `fields` its own
        (seq, source, detail, …). `fields` becomes the sink's."""
        try:
            self._put((owner, kind, fields, time.time()))
        except Exception:  # the host's task must never see our failure
            log.exception("adapter %s: an event could not be queued", self.adapter)

    def _put(self, item: _Queued) -> None:
        if self._closed:
            reason = self._closed_reason
            self._dropped[reason].inc()
            self._late.add(reason)
            return
        if len(self._queue) >= self._capacity:
            self._dropped[DropReason.QUEUE_FULL].inc()
            return
        self._queue.append(item)
        handoff = self._handoff
        if handoff.idle.is_set():  # after the append: the sender re-checks the queue once idle
            handoff.idle.clear()
        if self._thread is None:  # first use, or a forked child (`_after_fork`)
            self._start()
        if handoff.sleeping:  # else the sender is lingering or busy, and finds the event itself
            handoff.wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event is handed to the producer and the producer has waited
        for Kafka's acknowledgements once (tests, shutdown). True when that happened in time."""
        deadline = time.monotonic() + timeout
        self._handoff.wake.set()
        return self._handoff.idle.wait(max(deadline - time.monotonic(), 0.0))

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued and wait for Kafka's acknowledgements within `timeout` (at
        least `_FINAL_SETTLE_S` after the queue is handed over), then stop; the rest counts as
        dropped. The wait is the whole bound: a sender's wait under way when the close comes
        (Kafka still down) ends before it, and what it left unacknowledged is waited for again
        until the bound, not for one last second."""
        close_by = time.monotonic() + timeout
        self.flush(timeout)
        self._close_by = close_by
        self._closed = True
        self._handoff.wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(close_by - time.monotonic(), 0.0) + _FINAL_SETTLE_S)
        left = self._take_all()
        if left:
            self._dropped_at_close(left, "never handed to Kafka")

    def _dropped_at_close(self, count: int, why: str) -> None:
        """Counted and said: a close that lets events go must not do it silently."""
        self._dropped[DropReason.CLOSED].inc(count)
        log.warning(
            "adapter %s: %d event(s) %s at close, counted as dropped (reason closed)",
            self.adapter,
            count,
            why,
        )

    @property
    def queued(self) -> int:
        return len(self._queue)

    def flush_first(self, flush: Callable[[float], bool]) -> None:
        """At exit, call `flush(seconds left)` before this sink sends what it holds: for a stage
        whose records become this sink's events later (LangGraph's ledger). Held weakly: a bound
        method, whose object the stage's owner keeps."""
        self._upstream.append(weakref.WeakMethod(flush))
        _hook_exit()

    def flush_at_exit(self) -> None:
        """What the process's exit does for this sink, for a process that ends without running
        `atexit` (a Celery prefork child ends with `os._exit`): send what it holds within
        `exit_flush_s`, count and log the rest, and stop. Never raises."""
        _flush_at_exit([self])

    # ---- the process's exit (`_flush_at_exit`) -------------------------------------------------

    def _running_here(self) -> bool:
        """A sender thread of this process (a forked child has none until it sends)."""
        thread = self._thread
        return thread is not None and self._pid == os.getpid() and thread.is_alive()

    def _flush_upstream(self, deadline: float) -> None:
        for ref in self._upstream:
            flush = ref()
            left = deadline - time.monotonic()
            if flush is not None and left > 0:
                try:
                    flush(left)
                except Exception:
                    log.exception("adapter %s: flushing at exit failed", self.adapter)

    def _begin_exit(self, deadline: float) -> None:
        """Stop taking events (one sent now counts as `exit`) and let the sender send what is
        queued, wait for Kafka until `deadline`, and end."""
        self._deadline = deadline
        self._closed_reason = DropReason.EXIT
        self._closed = True
        self._handoff.wake.set()

    def _finish_exit(self) -> None:
        """Wait for the sender until the deadline, then count and log what it could not send:
        what it says it left, or, if it is still at work, what is queued and what the producer
        holds unacknowledged."""
        assert self._deadline is not None
        thread = self._thread
        if thread is not None:
            thread.join(max(self._deadline - time.monotonic(), 0.0))
        with self._exit_lock:
            if self._accounted:
                left = self._unsent
            else:
                self._abandoned = True
                left = self._unacknowledged() + self._holding
        left += self._take_all()
        if left:
            self._dropped[DropReason.EXIT].inc(left)
            log.warning(
                "adapter %s: %d event(s) not sent at exit: Kafka did not take them within %gs "
                "(%s); counted as dropped, reason exit",
                self.adapter,
                left,
                self.exit_flush_s,
                env_var("adapter_exit_flush_s"),
            )

    def _unacknowledged(self) -> int:
        """What the sender's producer holds that Kafka has not acknowledged, if it can say
        (`Emitter.unacknowledged`); read while the sender may still be waiting on it."""
        count = getattr(self._publisher, "unacknowledged", None)
        try:
            return int(count()) if count is not None else 0
        except Exception:  # closed meanwhile: nothing it holds any more
            return 0

    def _take_all(self) -> int:
        """Empty the queue; how many events it held (each taken once, whoever else takes)."""
        taken = 0
        queue = self._queue
        while True:
            try:
                queue.popleft()
            except IndexError:
                return taken
            taken += 1

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
        _hook_exit()

    def _after_fork(self) -> None:
        """In a forked child: the parent's queue is the parent's to send; start afresh."""
        self._queue.clear()
        self._thread = None
        self._lock = threading.Lock()
        self._handoff = Handoff()
        self._late = _LateDrops(self.adapter)  # the parent's are the parent's to say
        self._reset_exit()

    def _run(self) -> None:
        publisher: Publisher | None = None
        unsettled = False  # published since the last wait for acknowledgements
        while True:
            if not self._queue:
                if self._closed:
                    break
                if publisher is not None and unsettled:
                    self._settle(publisher, self._bounded(_SETTLE_S))
                    unsettled = False
                if not self._queue:
                    self._handoff.rest(self._queue, _IDLE_WAIT_S)
                    continue
            if publisher is None:
                publisher = self._publisher = self._connect()
                if publisher is None:
                    continue
            # Woken by the host, or after a batch: more events come while we wait (a flush or
            # close ends the wait). The host wakes no one meanwhile.
            self._handoff.wake.wait(self._linger_s)
            self._handoff.wake.clear()
            publisher = self._publisher = self._batch(publisher)
            unsettled = True
        left = 0
        if publisher is not None:
            # At exit, the rest of the exit's bound; at close, the rest of the close's (at
            # least a last wait, after `flush` handed the queue over).
            timeout = (
                max(self._close_by - time.monotonic(), _FINAL_SETTLE_S)
                if self._deadline is None
                else self._bounded(math.inf)
            )
            left = self._settle(publisher, timeout)
        self._account(left)
        if publisher is not None:
            publisher.close()  # (discards what Kafka did not acknowledge: counted just now)
        self._handoff.idle.set()

    def _bounded(self, timeout: float) -> float:
        """`timeout`, or less when the exit's deadline comes first."""
        if self._deadline is None:
            return timeout
        return max(min(timeout, self._deadline - time.monotonic()), 0.0)

    def _account(self, left: int) -> None:
        """The sender ends with `left` events unacknowledged: dropped by `close`, or left for
        the exit to count and log (unless the exit's bound passed first: then it counted)."""
        with self._exit_lock:
            if self._abandoned:
                return
            if self._deadline is not None:
                self._unsent = left
            elif left:
                self._dropped_at_close(left, "not acknowledged by Kafka")
            self._accounted = True

    def _connect(self) -> Publisher | None:
        try:
            return self._make()
        except Exception as exc:
            dropped = self._take_all()
            self._dropped[DropReason.KAFKA].inc(dropped)
            log.warning(
                "adapter %s: no Kafka producer: %s; %d event(s) dropped",
                self.adapter,
                _unavailable(exc, from_env=self._make is _from_env),
                dropped,
            )
            if not self._closed:
                time.sleep(_RETRY_S)
            return None

    def _batch(self, publisher: Publisher) -> Publisher | None:
        """Publish what is queued now (the rest waits for the next batch)."""
        raw: Callable[[str, bytes], None] | None = getattr(publisher, "publish_json", None)
        sent = 0
        queue = self._queue
        try:
            for _ in range(len(queue)):
                try:
                    item = queue.popleft()
                except IndexError:  # the exit took the rest (`_take_all`)
                    break
                self._holding = 1  # taken, not yet the producer's: the exit counts it
                encoded = self._encode(item)
                if encoded is not None:
                    key, value, event = encoded
                    if raw is not None:
                        raw(key, value)
                    else:
                        publisher.publish(event, value)
                    sent += 1
                self._holding = 0
        except Exception as exc:
            self._holding = 0
            self._dropped[DropReason.KAFKA].inc()
            log.warning("adapter %s: event not published (%s)", self.adapter, type(exc).__name__)
            self._publisher = None
            publisher.close()
            return None
        finally:
            self._sent.inc(sent)
        return publisher

    def _encode(self, item: _Queued) -> tuple[str, bytes, OwnershipEvent] | None:
        """The event's key, JSON and validated form; None when it was invalid (counted and
        logged)."""
        if type(item) is tuple:
            owner, kind, own, at = item
            fields = {**owner, "kind": kind, **own}
            if "event_id" not in own:
                fields["event_id"] = _event_id()
            fields["observed_at"] = datetime.fromtimestamp(at, UTC)
        else:
            assert isinstance(item, dict)
            fields = item
        return self._checked(fields)

    def _checked(self, fields: Mapping[str, Any]) -> tuple[str, bytes, OwnershipEvent] | None:
        """The contract's validation, as a detector reads the bytes sent (its pydantic model):
        no limit is restated here."""
        try:
            value = _ENCODE(fields)
            event = parse_event_json(value)
        except (EventError, TypeError) as exc:
            self._dropped[DropReason.INVALID].inc()
            log.warning(
                "adapter %s: invalid event for workflow %r dropped: %s",
                self.adapter,
                str(fields.get("workflow_key"))[:MAX_KEY_CHARS],
                exc,
            )
            return None
        if event.dropped_fields:
            # Sent without them, as a detector would read it; the host's code can fix them.
            log.warning(
                "adapter %s: event for workflow %r sent without %s",
                self.adapter,
                event.workflow_key,
                ", ".join(f"{d.field} ({d.reason})" for d in event.dropped_fields),
            )
            value = event.model_dump_json(exclude_none=True).encode("utf-8")
        return event.workflow_key, value, event

    def _settle(self, publisher: Publisher, timeout: float) -> int:
        """Wait for Kafka's acknowledgements, counting the events it refused; how many it had
        not acknowledged when the wait ended (still the producer's: it may yet send them)."""
        try:
            publisher.flush(timeout)
        except Exception as exc:
            failures = getattr(exc, "failures", None)
            if failures:
                self._dropped[DropReason.KAFKA].inc(len(failures))
            pending = getattr(exc, "pending", 0)
            # At exit, the exit's own line says what is left.
            if failures or not pending or self._deadline is None:
                log.warning("adapter %s: Kafka did not take events (%s)", self.adapter, exc)
            return pending if type(pending) is int else 0
        return 0


def _reset_after_fork() -> None:
    global _exit_hook  # noqa: PLW0603  (a lock another thread may have held at the fork)
    _exit_hook = threading.Lock()
    _event_id.reset()
    for sink in list(_sinks):
        sink._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
