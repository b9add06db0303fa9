"""The library workers use to publish ownership and effect events to Kafka.

Every event is validated against the input contract before it leaves the process, so a bad
event fails in the worker that made it (where someone can fix it) instead of landing in the DLQ.
The producer settings are fixed, not defaults: idempotence and `acks=all` because a lost or
duplicated ownership event is a wrong verdict, and the Java partitioner (`murmur2_random`) so that
librdkafka, aiokafka and Java clients put a workflow's events on the same partition, in order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, NotRequired, Self, TypedDict, Unpack
from uuid import uuid4

from confluent_kafka import KafkaError, Message, Producer
from opentelemetry import propagate, trace

from detector.closing import Closing
from detector.contracts.events import Kind, OwnershipEvent, Source, parse_event_strict
from detector.contracts.topics import INPUT_TOPIC
from detector.errors import SplitbrainError
from detector.kafka.config import KafkaClientError, KafkaConnection, env_name, raise_unrecoverable

PRODUCER_SETTINGS: Final[Mapping[str, Any]] = {
    "enable.idempotence": True,
    "acks": "all",
    "partitioner": "murmur2_random",
}
DEFAULT_FLUSH_TIMEOUT: Final = 30.0
# A poll that returned this much later than it was asked to: the process did not run meanwhile
# (SIGSTOP, a frozen container or VM), and that time is not counted against a flush's timeout.
PAUSE_S: Final = 1.0
_POLL_S: Final = 0.1
# A record's headers, as confluent-kafka takes them.
Headers = dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]]


class Fields(TypedDict):
    """What every typed helper takes; the kind-specific fields are the helper's own arguments."""

    workflow_key: str
    owner_epoch: int
    worker_id: str
    event_id: NotRequired[str]  # default: a fresh uuid4 hex (as in `emit`)
    seq: NotRequired[int | None]
    source: NotRequired[Source]  # default: who normally asserts this kind
    observed_at: NotRequired[datetime | None]  # default: now, the emitter's clock (as in `emit`)
    attrs: NotRequired[dict[str, str] | None]
    detail: NotRequired[dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    workflow_key: str
    reason: str


class DeliveryError(SplitbrainError, RuntimeError):
    """Events that Kafka did not acknowledge: the caller must not assume they were recorded."""

    def __init__(self, message: str, failures: list[DeliveryFailure], pending: int = 0) -> None:
        super().__init__(message)
        self.failures = failures
        self.pending = pending  # still unacknowledged when the wait ended


class Emitter(Closing):
    """Validates events and publishes them keyed by workflow, with the caller's trace context.

    Use as a context manager (or call `flush`, then `close`): leaving the block waits for every
    event to be acknowledged, raises `DeliveryError` if any was not, and closes the producer.
    """

    def __init__(self, config: Mapping[str, Any], *, topic: str = INPUT_TOPIC) -> None:
        """`config` is librdkafka settings, e.g. `KafkaConnection.from_args(args).client_config()`
        (`detector.kafka.config`)."""
        self.topic = topic
        self.sent = 0
        self._failures: list[DeliveryFailure] = []
        self._producer = Producer({"error_cb": raise_unrecoverable, **config, **PRODUCER_SETTINGS})

    @classmethod
    def from_env(cls, *, topic: str = INPUT_TOPIC) -> Self:
        """An emitter configured only by `SPLITBRAIN_*` environment variables, for workers; a
        `SettingsError` names a variable that cannot be used, a `KafkaClientError` one to set."""
        connection = KafkaConnection.from_env()
        if connection.bootstrap_servers is None:
            raise KafkaClientError(
                f"{env_name('bootstrap.servers')} is not set (librdkafka's bootstrap.servers: "
                "the Kafka cluster to publish to, e.g. kafka:9092)"
            )
        return cls(connection.client_config(), topic=topic)

    def finish(self, exc: BaseException | None) -> None:
        if exc is None:
            self.flush()
        elif not isinstance(exc, KafkaClientError):
            # Deliver what was accepted, but do not hide the error already on its way out.
            # (After a KafkaClientError, such as a wrong password, nothing can be delivered.)
            self._drain(DEFAULT_FLUSH_TIMEOUT)

    def close(self) -> None:
        """Release the producer's threads and connections; `flush` first.

        Whatever is still unacknowledged is dropped first, because librdkafka's own close waits
        for it without a limit, which would hang on an unreachable cluster.
        """
        self._producer.purge()
        self._producer.close()

    def emit(
        self, event: OwnershipEvent | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> OwnershipEvent:
        """Validate and send one event; returns it as sent. Raises `EventError` if invalid.

        An `OwnershipEvent` is sent as it is. A mapping or keyword fields are validated like any
        input, with a fresh `event_id` and `observed_at` = now unless given. Delivery is
        asynchronous: failures surface from `flush`.
        """
        if isinstance(event, OwnershipEvent):
            if fields:
                raise TypeError("pass either an OwnershipEvent or fields, not both")
            validated = event
        else:
            defaults = {"event_id": uuid4().hex, "observed_at": datetime.now(UTC)}
            validated = parse_event_strict({**defaults, **(event or {}), **fields})
        self._send(validated)
        return validated

    def flush(self, timeout: float = DEFAULT_FLUSH_TIMEOUT) -> None:
        """Wait until every event is acknowledged; raise `DeliveryError` for any that was not."""
        pending = self._drain(timeout)
        failures, self._failures = self._failures, []
        if pending:
            raise DeliveryError(
                f"{pending} event(s) not acknowledged within {timeout:g}s", failures, pending
            )
        if failures:
            raise DeliveryError(
                f"{len(failures)} event(s) not delivered, first: {failures[0].reason}", failures
            )

    def _drain(self, timeout: float) -> int:
        """Serve callbacks until everything is acknowledged or `timeout`; returns what is left.

        `poll`, not `Producer.flush`: an error raised by the error callback (a wrong password)
        ends `poll` at once, while `flush` carries on for seconds before it re-raises.

        `timeout` is time this process ran: a stretch in which it did not (stopped by SIGSTOP,
        a frozen container or VM; seen as a poll that came back more than `PAUSE_S` late) is
        added to the wait, since Kafka's answers could not be served then. Without that, a
        process paused past the timeout woke up and called unacknowledged the events whose
        acknowledgements were waiting to be read. And before anything is called unacknowledged,
        what arrived meanwhile is served once more.
        """
        last = time.monotonic()
        deadline = last + timeout
        asked = 0.0
        while len(self._producer):
            now = time.monotonic()
            late = now - last - asked
            if late > PAUSE_S:
                deadline += late
            left = deadline - now
            if left <= 0:
                self._producer.poll(0)
                break
            asked = min(_POLL_S, left)
            self._producer.poll(asked)
            last = now
        return len(self._producer)

    def unacknowledged(self) -> int:
        """Events handed to the producer that Kafka has not acknowledged yet (safe to ask from
        another thread than the one that flushes)."""
        return len(self._producer)

    def publish(self, event: OwnershipEvent, value: bytes) -> None:
        """Send an event already validated from `value`, its JSON: spares encoding it again
        (the adapters' sink validates what it encoded itself)."""
        self._produce(event, value)

    def publish_json(self, workflow_key: str, value: bytes) -> None:
        """Send `value`, an event's JSON the caller made valid, keyed by its workflow: the
        adapters' sink, whose thread runs in no span (there is no trace context to carry)."""
        self._enqueue(workflow_key.encode("utf-8"), value, None)

    def dead_letter(self, topic: str, key: bytes, value: bytes, headers: Headers) -> None:
        """Send a record that is no valid event to the dead-letter topic `topic`, as it is, with
        the headers that say why (`detector.contracts.dead_letters`); `flush` waits for its
        acknowledgement as for an event's."""
        self._enqueue(key, value, headers, topic)

    def _send(self, event: OwnershipEvent) -> None:
        self._produce(event, event.model_dump_json(exclude_none=True).encode("utf-8"))

    def _produce(self, event: OwnershipEvent, value: bytes) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("splitbrain.workflow.key", event.workflow_key)
            span.set_attribute("splitbrain.owner.epoch", event.owner_epoch)
        headers: dict[str, str | bytes | None] = {}
        propagate.inject(headers)  # `traceparent` (W3C) from the current span, if there is one
        self._enqueue(event.workflow_key.encode("utf-8"), value, headers)

    def _enqueue(
        self, key: bytes, value: bytes, headers: Headers | None, topic: str | None = None
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic or self.topic, value, key, headers=headers, on_delivery=self._on_delivery
                )
                break
            except BufferError:
                # The local queue is full: wait for acknowledgements instead of dropping events.
                self._producer.poll(0.5)
        self.sent += 1
        self._producer.poll(0)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            key = msg.key()
            workflow = key.decode("utf-8", "replace") if key is not None else "?"
            self._failures.append(DeliveryFailure(workflow, err.str()))

    def _typed(self, kind: Kind, source: Source, fields: Fields, **specific: Any) -> OwnershipEvent:
        given = {k: v for k, v in specific.items() if v is not None}
        return self.emit({"source": source, **fields, **given, "kind": kind})

    def _effect(
        self, kind: Kind, effect_key: str, destination: str | None, fields: Fields
    ) -> OwnershipEvent:
        """An effect event: a worker's by default (`fields` may say another source)."""
        return self._typed(
            kind, Source.WORKER, fields, effect_key=effect_key, destination=destination
        )

    # -- one helper per kind: the arguments say what each kind carries ------------------------

    def lease_acquired(
        self,
        *,
        lease_until: datetime | None = None,
        lease_duration_s: float | None = None,
        heartbeat_interval_s: float | None = None,
        **fields: Unpack[Fields],
    ) -> OwnershipEvent:
        return self._typed(
            Kind.LEASE_ACQUIRED,
            Source.COORDINATOR,
            fields,
            lease_until=lease_until,
            lease_duration_s=lease_duration_s,
            heartbeat_interval_s=heartbeat_interval_s,
        )

    def heartbeat(
        self, *, lease_until: datetime | None = None, **fields: Unpack[Fields]
    ) -> OwnershipEvent:
        return self._typed(Kind.HEARTBEAT, Source.WORKER, fields, lease_until=lease_until)

    def lease_lost(self, **fields: Unpack[Fields]) -> OwnershipEvent:
        return self._typed(Kind.LEASE_LOST, Source.WORKER, fields)

    def ownership_uncertain(self, **fields: Unpack[Fields]) -> OwnershipEvent:
        return self._typed(Kind.OWNERSHIP_UNCERTAIN, Source.WORKER, fields)

    def progress(self, **fields: Unpack[Fields]) -> OwnershipEvent:
        return self._typed(Kind.PROGRESS, Source.WORKER, fields)

    def effect_attempted(
        self, *, effect_key: str, destination: str | None = None, **fields: Unpack[Fields]
    ) -> OwnershipEvent:
        return self._effect(Kind.EFFECT_ATTEMPTED, effect_key, destination, fields)

    def effect_committed(
        self, *, effect_key: str, destination: str | None = None, **fields: Unpack[Fields]
    ) -> OwnershipEvent:
        """A worker's claim by default; a destination confirming passes `source=DESTINATION`."""
        return self._effect(Kind.EFFECT_COMMITTED, effect_key, destination, fields)

    def effect_rejected(
        self, *, effect_key: str, destination: str | None = None, **fields: Unpack[Fields]
    ) -> OwnershipEvent:
        return self._effect(Kind.EFFECT_REJECTED, effect_key, destination, fields)

    def outcome_verified(self, *, effect_key: str, **fields: Unpack[Fields]) -> OwnershipEvent:
        return self._typed(Kind.OUTCOME_VERIFIED, Source.VERIFIER, fields, effect_key=effect_key)

    def lease_released(self, **fields: Unpack[Fields]) -> OwnershipEvent:
        return self._typed(Kind.LEASE_RELEASED, Source.WORKER, fields)
