"""The edge of a worker: one Kafka record in, either a valid event or a dead letter with reasons.

Both runtimes use it, so a poison message is judged the same way whichever runtime reads it.
"""

from __future__ import annotations

from detector.contracts.dead_letters import DeadLetter
from detector.contracts.events import MAX_EVENT_BYTES, EventError, OwnershipEvent, parse_event_json
from detector.telemetry.trace_context import Headers, traceparent


def admit(
    key: bytes | None,
    value: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    headers: Headers = None,
) -> OwnershipEvent | DeadLetter:
    """Validate a record: size, the event model (the JSON parser rejects bad UTF-8 itself), and
    that the key is the workflow's.

    Only a required field dead-letters: an event with an invalid optional field is returned
    without it, and lists what it lost in `event.dropped_fields` (count them with
    `WorkerMetrics.fields_dropped`).

    A valid W3C `traceparent` header gives the event its `trace_id` and `span_id` (DESIGN §3),
    over the event's own fields: the engine keeps them on the evidence it retains, and a finding
    lists those of its conditions as `trace_links`."""

    def dead(reason: str, field: str | None = None) -> DeadLetter:
        return DeadLetter(reason, field, key, value, topic, partition, offset)

    if not value:
        return dead("empty: the record has no value")
    if len(value) > MAX_EVENT_BYTES:
        return dead(f"too_large: {len(value)} bytes; an event may have {MAX_EVENT_BYTES}")
    try:
        event = parse_event_json(value, traceparent(headers) if headers else None)
    except EventError as exc:
        return dead(f"invalid: {exc.reason}", exc.field)
    if key is None:
        return dead("no_key: the message key must be the workflow_key", "workflow_key")
    if key != event.workflow_key.encode():
        return dead("key_mismatch: the message key is not the event's workflow_key", "workflow_key")
    return event
