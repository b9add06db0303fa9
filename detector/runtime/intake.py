"""The edge of a worker: one Kafka record in, either a valid event or a dead letter with reasons.

Both runtimes use it, so a poison message is judged the same way whichever runtime reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final, TypeAlias

from detector.contracts.dead_letters import DeadLetter
from detector.contracts.events import MAX_EVENT_BYTES, EventError, OwnershipEvent, parse_event_json

# A record's headers as confluent-kafka (a list of pairs) or faust (a list or a mapping) give them.
Headers: TypeAlias = (
    Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None
)

# W3C Trace Context: version-traceid-spanid-flags, lower-case hex; a later version may append
# fields after a dash, version 00 may not; ff is never valid.
_TRACEPARENT: Final = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(?:-[ -~]*)?")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16


def traceparent(headers: Headers) -> tuple[str, str] | None:
    """The (trace id, span id) of a record's valid `traceparent` header, in hex; None without
    one (an invalid header is ignored, as the W3C recommendation says)."""
    if not headers:
        return None
    raw: str | bytes | None = None
    if type(headers) is list or not isinstance(headers, Mapping):  # a list: the common case
        for name, value in headers:
            if name == "traceparent":
                raw = value
                break
    else:
        raw = headers.get("traceparent")
    if not raw:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if _TRACEPARENT.fullmatch(text) is None:
        return None
    trace_id, span_id = text[3:35], text[36:52]
    if (
        (text[:2] == "00" and len(text) != 55)
        or text[:2] == "ff"
        or trace_id == _ZERO_TRACE
        or span_id == _ZERO_SPAN
    ):
        return None
    return trace_id, span_id


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
        event = parse_event_json(value)
    except EventError as exc:
        return dead(f"invalid: {exc.reason}", exc.field)
    if key is None:
        return dead("no_key: the message key must be the workflow_key", "workflow_key")
    if key != event.workflow_key.encode():
        return dead("key_mismatch: the message key is not the event's workflow_key", "workflow_key")
    if headers:
        context = traceparent(headers)
        if context is not None and (event.trace_id, event.span_id) != context:
            # The event was parsed just now and nobody else holds it: set the two fields in
            # place (what `model_copy` would do, at a tenth of its cost), and say they are set.
            fields = event.__dict__
            fields["trace_id"], fields["span_id"] = context
            event.__pydantic_fields_set__.update(("trace_id", "span_id"))
    return event
