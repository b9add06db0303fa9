"""The W3C Trace Context of a Kafka record: its `traceparent` header, read once for the worker's
intake (`detector.runtime.intake.admit`) and its processing spans (`detector.telemetry.tracing`).

Written with OpenTelemetry's own propagator (`detector.kafka.emit`); read here, without it: the
intake reads the header of every record, and needs only its two ids, not a context object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final, TypeAlias

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
