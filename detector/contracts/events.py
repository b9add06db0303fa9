"""The input contract `splitbrain.ownership/v1`: one ownership or effect event.

Validation happens here, at the edge, so that the rules in `detector.core` can trust every field.
Job-queue vocabularies (kind and field aliases) are folded into the canonical names on the way in.
Only a required field can cost an event: an invalid or unreadable optional one is left out, and
the event says so in `dropped_fields`; an unknown one is ignored, whatever it holds (DESIGN §3).
Enter through `parse_event_json` and `parse_event_obj`: the drops, the names that must agree and
the `request` of a job queue are handled there, on slow paths that a valid canonical event never
takes. The slowest, for a text the JSON parser refuses for a part it cannot read (nesting deeper
than 200, an unpaired surrogate, bytes that are not UTF-8, a number of more than 4300 digits),
reads the object again member by member (`_members`: a tokenizer in Python, ~0.3 ms of CPU for
a `detail` nested 300 deep, up to ~90 ms for the worst 64 KiB text, 20,000 empty lists).
What a valid event does pay is one filter for a field written twice (`_may_repeat`: ~1.0 µs per
event against ~3.0 µs for the parse, 1.35 µs with a `detail`; `python bench/bench_parse.py`),
since the JSON parser keeps a repeated key's last value without a word.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final

from pydantic import (
    AfterValidator,
    AliasChoices,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import (
    ErrorDetails,
    PydanticCustomError,
    PydanticSerializationError,
    from_json,
    to_json,
)

from detector.errors import SplitbrainError

SCHEMA: Final = "splitbrain.ownership/v1"
# One Kafka record or one history line, in the worker and in `audit` alike (DESIGN §3).
MAX_EVENT_BYTES: Final = 64 * 1024
MAX_DETAIL_BYTES: Final = 4096
MAX_EPOCH: Final = 2**63 - 1
# The longest texts of DESIGN §3, in characters: a workflow or effect key, a worker id, a
# destination, an event id, and a label (an `attrs` name or value).
MAX_KEY_CHARS: Final = 512
MAX_WORKER_ID_CHARS: Final = 256
MAX_DESTINATION_CHARS: Final = 256
MAX_EVENT_ID_CHARS: Final = 128
MAX_LABEL_CHARS: Final = 128
MAX_ATTRS: Final = 16  # labels in an event's `attrs`
# The `attrs` every adapter sets: how far an event's epoch can be trusted, and where it came from.
AUTHORITY_ATTR: Final = "epoch_authority"
EPOCH_FROM_ATTR: Final = "epoch_from"


class Kind(StrEnum):
    """Canonical kinds; job-queue aliases resolve in `_missing_`, off the validator's fast path."""

    LEASE_ACQUIRED = "lease_acquired"
    HEARTBEAT = "heartbeat"
    LEASE_LOST = "lease_lost"
    OWNERSHIP_UNCERTAIN = "ownership_uncertain"
    PROGRESS = "progress"
    EFFECT_ATTEMPTED = "effect_attempted"
    EFFECT_COMMITTED = "effect_committed"
    EFFECT_REJECTED = "effect_rejected"
    OUTCOME_VERIFIED = "outcome_verified"
    LEASE_RELEASED = "lease_released"

    @classmethod
    def _missing_(cls, value: object) -> Kind | None:
        return KIND_ALIASES.get(value) if isinstance(value, str) else None


class Source(StrEnum):
    COORDINATOR = "coordinator"
    WORKER = "worker"
    DESTINATION = "destination"
    VERIFIER = "verifier"


KIND_ALIASES: Final[dict[str, Kind]] = {
    "job_claimed": Kind.LEASE_ACQUIRED,
    "heartbeat_ok": Kind.HEARTBEAT,
    "heartbeat_lost": Kind.LEASE_LOST,
    "tool_request_started": Kind.EFFECT_ATTEMPTED,
    "result_rejected": Kind.EFFECT_REJECTED,
}
# A job queue's `result_rejected` names no effect: the job's result is the effect.
REJECTED_RESULT_KEY: Final = "result"
# A job queue's `tool_request_started` names its request instead; without one, the request is.
TOOL_REQUEST_KIND: Final = "tool_request_started"
TOOL_REQUEST_FIELD: Final = "request"
TOOL_REQUEST_KEY: Final = "tool_request"
# Job-queue names of required fields. One field given under two of its names must agree.
FIELD_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "workflow_key": ("job",),
    "owner_epoch": ("token", "fencing_token"),
    "worker_id": ("worker", "owner_id"),
}

EFFECT_KINDS: Final = frozenset(
    {Kind.EFFECT_ATTEMPTED, Kind.EFFECT_COMMITTED, Kind.EFFECT_REJECTED, Kind.OUTCOME_VERIFIED}
)


# The error type of an effect kind without an effect key: a required field, named `effect_key`.
_NEEDS_KEY: Final = "effect_key_required"


@dataclass(frozen=True, slots=True)
class FieldDrop:
    """An invalid optional field left out of an event that was kept, and why (DESIGN §3)."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


# One encoder for every event: `json.dumps` with these options builds a new one per call, which
# was half of what checking a `detail` cost.
_COMPACT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _detail_fits(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        size = len(_COMPACT.encode(value).encode())
        if size > MAX_DETAIL_BYTES:
            raise PydanticCustomError(
                "detail_too_large",
                "{size} bytes serialised; the limit is {limit}",
                {"size": size, "limit": MAX_DETAIL_BYTES},
            )
    return value


ShortLabel = Annotated[str, Field(max_length=MAX_LABEL_CHARS)]
# Whether the input used a job-queue name of a required field (its value is the first such name
# present). Only then do the parse functions compare the names, since `AliasChoices` takes the
# first name present and ignores the others: canonical events pay a few dictionary lookups in
# Rust and nothing in Python. Left out of dumps, reprs and the JSON Schema.
_JobQueueName = SkipJsonSchema[
    Annotated[
        Any,
        Field(
            default=None,
            exclude=True,
            repr=False,
            validation_alias=AliasChoices(*(a for names in FIELD_ALIASES.values() for a in names)),
        ),
    ]
]


class OwnershipEvent(BaseModel):
    """One fact about who owns a workflow, or what an owner did to the outside world."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, str_strip_whitespace=False
    )

    event_id: Annotated[str, Field(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
    kind: Kind
    workflow_key: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_KEY_CHARS,
            validation_alias=AliasChoices("workflow_key", *FIELD_ALIASES["workflow_key"]),
        ),
    ]
    owner_epoch: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_EPOCH,
            strict=True,
            validation_alias=AliasChoices("owner_epoch", *FIELD_ALIASES["owner_epoch"]),
        ),
    ]
    worker_id: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_WORKER_ID_CHARS,
            validation_alias=AliasChoices("worker_id", *FIELD_ALIASES["worker_id"]),
        ),
    ]
    seq: Annotated[int | None, Field(ge=0, le=MAX_EPOCH, strict=True)] = None
    source: Source = Source.WORKER
    observed_at: Annotated[AwareDatetime | None, Field(strict=True)] = None
    effect_key: Annotated[str | None, Field(min_length=1, max_length=MAX_KEY_CHARS)] = None
    destination: Annotated[str | None, Field(max_length=MAX_DESTINATION_CHARS)] = None
    lease_until: Annotated[AwareDatetime | None, Field(strict=True)] = None
    lease_duration_s: Annotated[float | None, Field(gt=0, strict=True, allow_inf_nan=False)] = None
    heartbeat_interval_s: Annotated[float | None, Field(gt=0, strict=True, allow_inf_nan=False)] = (
        None
    )
    attrs: Annotated[dict[ShortLabel, ShortLabel] | None, Field(max_length=MAX_ATTRS)] = None
    detail: Annotated[dict[str, Any] | None, AfterValidator(_detail_fits)] = None
    trace_id: Annotated[str | None, Field(pattern=r"^[0-9a-f]{32}$")] = None
    span_id: Annotated[str | None, Field(pattern=r"^[0-9a-f]{16}$")] = None
    job_queue_name: _JobQueueName

    # The invalid optional fields left out of this event, each with its reason. A class default
    # overridden per instance only on the rare slow path: a pydantic private attribute would
    # cost every valid event an extra initialisation.
    dropped_fields: ClassVar[tuple[FieldDrop, ...]] = ()

    @model_validator(mode="after")
    def _effect_needs_key(self) -> OwnershipEvent:
        if self.effect_key is None and self.kind in EFFECT_KINDS:
            if self.kind is not Kind.EFFECT_REJECTED:
                raise PydanticCustomError(
                    _NEEDS_KEY,
                    "required for kind {kind}",
                    {"kind": self.kind.value},
                )
            object.__setattr__(self, "effect_key", REJECTED_RESULT_KEY)
        return self

    def observed_ts(self) -> float | None:
        """The emitter's clock as epoch seconds: for freshness and lag, never for ordering."""
        return None if self.observed_at is None else self.observed_at.timestamp()


# The fields whose invalid value is dropped rather than costing the event (DESIGN §3), in model
# order: every field the model does not require, plus a job queue's `request` (an effect key).
# Also the bounded label values of `splitbrain_event_fields_dropped_total{field}`.
OPTIONAL_FIELDS: Final[tuple[str, ...]] = (
    *(
        name
        for name, info in OwnershipEvent.model_fields.items()
        if not info.is_required() and not info.exclude
    ),
    TOOL_REQUEST_FIELD,
)
_DROPPABLE: Final = frozenset(OPTIONAL_FIELDS)


class EventError(SplitbrainError, ValueError):
    """An input that is not a valid event, with the field and reason to report or dead-letter."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason if field is None else f"{field}: {reason}")
        self.reason = reason
        self.field = field

    @classmethod
    def from_error(cls, error: ErrorDetails) -> EventError:
        if error["type"] == _NEEDS_KEY:
            return cls(error["msg"], "effect_key")
        return cls(error["msg"], ".".join(str(p) for p in error["loc"]) or None)

    @classmethod
    def from_validation(cls, exc: ValidationError) -> EventError:
        return cls.from_error(exc.errors(include_url=False)[0])

    def detached(self) -> EventError:
        """The same error with no traceback or chained exception: safe to keep by the thousand
        (a raised error holds the frames, and the input, of the parse that raised it)."""
        return EventError(self.reason, self.field)


# The invalid optional fields of one input, by name: the first reason found for each.
_Drops = dict[str, FieldDrop]


def parse_event_json(raw: str | bytes, trace: tuple[str, str] | None = None) -> OwnershipEvent:
    """Parse one JSON object into an event, or raise `EventError` naming the field.

    An invalid or unreadable optional field is dropped and listed in the event's
    `dropped_fields`; an unknown one is ignored, whatever it holds. A field the event is read
    from, given twice with different values, makes it malformed (DESIGN §3): the JSON parsers
    keep the last value silently.

    `trace`, the (trace id, span id) of the record that carried the event (its valid
    `traceparent`, in lower-case hex), is the event's `trace_id` and `span_id` over its own.
    """
    try:
        event = OwnershipEvent.model_validate_json(raw)
    except ValidationError as exc:
        event = _read_slowly(raw, exc)
    else:
        if "job_queue_name" in event.__pydantic_fields_set__ or _may_repeat(raw, event):
            event = _checked(event, raw, {})  # the property costs twice as much as the set
    if trace is not None and (event.trace_id, event.span_id) != trace:
        _set_trace(event, trace)
    return event


def _set_trace(event: OwnershipEvent, trace: tuple[str, str]) -> None:
    """`event`, just parsed and held by no one else, gets its record's trace context in place:
    what `model_copy` would do, at a tenth of its cost."""
    fields = event.__dict__
    fields["trace_id"], fields["span_id"] = trace
    event.__pydantic_fields_set__.update(("trace_id", "span_id"))


def _read_slowly(raw: str | bytes, exc: ValidationError) -> OwnershipEvent:
    """An input that failed validation. When the JSON parser refused the text as a whole (a
    nesting deeper than it allows, an unpaired surrogate, a number out of its range, bytes
    that are not UTF-8), it is read again without the members that cannot be read: an unknown
    one is ignored, an optional one dropped, a required one costs the event."""
    drops: _Drops = {}
    if _unreadable_part(exc.errors(include_url=False)[0]):
        raw = _readable_members(raw, exc, drops)
        try:
            return _checked(OwnershipEvent.model_validate_json(raw), raw, drops)
        except ValidationError as again:
            exc = again
    drops.update(_once_each(raw))
    return _salvage(exc, lambda: from_json(raw), drops)


def _checked(event: OwnershipEvent, raw: str | bytes, drops: _Drops) -> OwnershipEvent:
    """A valid event whose text may name a field twice or use a job queue's names: both
    checked, and the event returned without what `drops` lists."""
    drops.update(_once_each(raw))
    if "job_queue_name" in event.__pydantic_fields_set__:
        _names_agree(from_json(raw))
        _forget_names(event)
    return _without(event, drops)


def _without(event: OwnershipEvent, drops: _Drops) -> OwnershipEvent:
    """`event`, just parsed and held by no one else, without the fields `drops` lists (an
    effect key the kind needs stays required), which it names in `dropped_fields`."""
    if not drops:
        return event
    if "effect_key" in drops and event.kind in EFFECT_KINDS:
        raise EventError(drops["effect_key"].reason, "effect_key")
    fields = event.__pydantic_fields_set__
    for name in drops.keys() & fields:
        event.__dict__[name] = OwnershipEvent.model_fields[name].default
        fields.discard(name)
    object.__setattr__(event, "dropped_fields", tuple(drops.values()))
    return event


# The names an event is read from: a repeated unknown name changes nothing and is not checked.
_READ_NAMES: Final = frozenset(
    {
        *(n for n, info in OwnershipEvent.model_fields.items() if not info.exclude),
        *(a for names in FIELD_ALIASES.values() for a in names),
        TOOL_REQUEST_FIELD,
    }
)
_CANONICAL: Final = {alias: name for name, aliases in FIELD_ALIASES.items() for alias in aliases}
# The optional fields that hold objects: a name given twice inside one costs only that field.
_OBJECT_FIELDS: Final = ("attrs", "detail")


# Where a name written compactly as a key ends, and each model field's name as such a key.
_KEY_END: Final = b'":'
_AS_KEY: Final = {name: f'"{name}":'.encode() for name in OwnershipEvent.model_fields}
_LOOSE: Final = re.compile(rb'"[ \t\n\r]').search  # a quote before whitespace (one C call)


def _may_repeat(raw: str | bytes, event: OwnershipEvent) -> bool:
    """Whether `raw` may give one of the event's fields, or a name inside its `attrs` or
    `detail`, twice: a cheap necessary condition, so that only such texts pay for `_once_each`.

    Every key ends in a quote and a colon, unless whitespace stands between them; string values
    may hold more such pairs (an escaped quote before a colon). So when no quote is followed by
    whitespace, a text with exactly as many quote-colons as the event has fields and nested keys
    names no key twice, whatever the escapes: that is the common case, two scans. Otherwise a
    field's name as a key more than once, an `attrs` or a `detail` (whose parsed keys are
    fewer than the text's when one is repeated), or an escape that could spell a name another
    way, sends it to the exact check."""
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _LOOSE(text) is not None:
        return True  # perhaps a key before a spaced colon
    fields = event.__pydantic_fields_set__
    attrs, detail = event.attrs, event.detail
    keys = len(fields) + (len(attrs) if attrs else 0) + (_keys_in(detail) if detail else 0)
    if text.count(_KEY_END) == keys:
        return False
    return (
        bool(attrs or detail) or b"\\u" in text or any(text.count(_AS_KEY[n]) > 1 for n in fields)
    )


def _keys_in(value: dict[str, Any] | list[Any]) -> int:
    """The keys of the objects in a parsed JSON value (a flat `detail` costs one loop)."""
    keys = 0
    if type(value) is dict:
        keys = len(value)
        value = list(value.values())
    for item in value:
        if type(item) is dict or type(item) is list:
            keys += _keys_in(item)
    return keys


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as the (name, value) pairs it was written with, repeats included."""


def _plain(value: Any) -> Any:
    """A value read with `_Pairs` for objects, as a comparable value (objects as dicts)."""
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _once_each(raw: str | bytes) -> _Drops:
    """Raise `EventError` when a name the event is read from is given twice with different
    values (a value's type counts: 1 is not 1.0 nor true); return as drops the `attrs` and
    `detail` inside which a name is given twice with different values. Not JSON, or not an
    object: the validator's own error says so."""
    try:
        top = json.loads(raw, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError alike
        return {}
    if not isinstance(top, _Pairs):
        return {}
    first: dict[str, Any] = {}
    for name, value in top:
        if name not in _READ_NAMES:
            continue
        if name not in first:
            first[name] = value
        elif not _same(first[name], value):
            raise EventError("given twice with different values", name)
    drops: _Drops = {}
    for name in _OBJECT_FIELDS:
        where = _twice_inside(first.get(name))
        if where is not None:
            drops[name] = FieldDrop(name, f"{where}: given twice with different values")
    return drops


def _twice_inside(value: Any, where: str = "") -> str | None:
    """The path of the first name given twice with different values in a value read with
    `_Pairs`, at any depth; None when each name says one thing."""
    if isinstance(value, _Pairs):
        first: dict[str, Any] = {}
        for name, item in value:
            path = f"{where}.{name}" if where else name
            if name not in first:
                first[name] = item
            elif not _same(first[name], item):
                return path if len(path) <= _MAX_PATH else path[: _MAX_PATH - 1] + "…"
            if (inner := _twice_inside(item, path)) is not None:
                return inner
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (inner := _twice_inside(item, f"{where}.{index}")) is not None:
                return inner
    return None


_MAX_PATH: Final = 80  # characters of a path in a drop's reason


def _same(a: Any, b: Any) -> bool:
    try:
        a, b = _plain(a), _plain(b)
    except RecursionError:
        return False
    return type(a) is type(b) and a == b


def _unreadable_part(error: ErrorDetails) -> bool:
    """Whether the JSON parser refused the whole text for a part that is JSON but that it
    cannot read (in bytes, or in a `str` that holds a lone surrogate): then reading it member
    by member may get past it. A text that is not JSON at all never takes that slower path."""
    if error["loc"]:
        return False
    if error["type"] == "string_unicode":
        return True
    reason = str(error.get("ctx", {}).get("error", ""))
    return error["type"] == "json_invalid" and any(part in reason for part in _UNREADABLE_PARTS)


# The JSON parser's words for what it cannot read in valid JSON (pydantic is pinned).
_UNREADABLE_PARTS: Final = (
    "recursion limit exceeded",  # nesting deeper than it allows (200)
    "number out of range",  # more than 4300 digits
    "surrogate",  # an unpaired \udc00
    "hex escape",  # an unpaired \ud800
    "unicode code point",  # bytes that are not UTF-8, a raw lone surrogate
)
# A JSON string as JSON writes it, not decoded: an escape or a byte the parser would refuse
# inside one stops nothing here.
_STRING: Final = rb'"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+"'
# A number or a literal, as the JSON parser reads them.
_SCALAR: Final = (
    rb"(?:-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][+-]?[0-9]++)?"
    rb"|true|false|null|NaN|-?Infinity)(?![0-9A-Za-z])"
)
# The JSON tokens of a text, each as (token, b"") or (b"", a byte no token starts with). A name
# is one token with its colon, and with the bracket of its object when it is the first; a run
# of brackets is one token, and so is a run of more items of a list, each a comma and a string
# or a scalar. Whitespace at the very end matches nothing and is skipped.
_TOKENS: Final = re.compile(
    rb"""[ \t\n\r]*+(?:
        ( \{[ \t\n\r]*+%(s)s[ \t\n\r]*+:
        | %(s)s(?:[ \t\n\r]*+:)?
        | [\[{](?:[ \t\n\r]*+[\[{])*+
        | [\]}](?:[ \t\n\r]*+[\]}])*+
        | (?:[ \t\n\r]*+,[ \t\n\r]*+(?:%(s)s(?![ \t\n\r]*+:)|%(v)s))++
        | ,
        | %(v)s
        ) | (.) )"""
    % {b"s": _STRING, b"v": _SCALAR},
    re.VERBOSE | re.DOTALL,
).findall
_SPACE: Final = b" \t\n\r"
_CLOSER_OF: Final = bytes.maketrans(b"[{", b"]}")
# What `_members` expects next: a value, a value or `]`, a name, a name or `}`, a comma or the
# end of its container.
_VALUE, _VALUE_OR_END, _NAME, _NAME_OR_END, _NEXT = range(5)
_QUOTE, _COMMA, _COLON, _OPEN_OBJECT, _OPEN_LIST, _CLOSE_OBJECT, _CLOSE_LIST = b'",:{[}]'


def _members(text: bytes) -> list[tuple[bytes, bytes]] | None:
    """The (name, value) texts of the members of the JSON object `text`, or None when it is
    not one. A grammar check with a stack of open containers, never recursion: no nesting
    depth, escape or number stops it, and a run of brackets is checked in one step."""
    tokens = _TOKENS(text)
    if not tokens or tokens[0][0][:1] != b"{":
        return None
    closers = bytearray()  # the closing bracket of each open container, innermost last
    members: list[tuple[bytes, bytes]] = []
    value: list[bytes] = []  # the tokens of the member being read
    expect, name = _VALUE, b""
    for token, stray in tokens:
        if stray or (not closers and expect == _NEXT):
            return None  # a byte no token starts with, or more after the object
        first, depth = token[0], len(closers)
        if first not in (_CLOSE_OBJECT, _CLOSE_LIST) and (
            depth > 1 or (depth == 1 and expect == _VALUE)
        ):
            value.append(token)  # a token of a member's value
        if token[-1] == _COLON:  # a name, perhaps with the bracket of its object
            if first == _OPEN_OBJECT:
                if expect not in (_VALUE, _VALUE_OR_END):
                    return None
                closers.append(_CLOSE_OBJECT)
            elif expect not in (_NAME, _NAME_OR_END):
                return None
            if len(closers) == 1:
                name = token[token.index(b'"') : token.rindex(b'"') + 1]
            expect = _VALUE
            continue
        if first in (_OPEN_OBJECT, _OPEN_LIST):
            run = token.translate(None, _SPACE)
            if (expect not in (_VALUE, _VALUE_OR_END)) or b"{" in run[:-1]:
                return None  # an object's first member is a name, never a value
            closers += run.translate(_CLOSER_OF)
            expect = _NAME_OR_END if run[-1] == _OPEN_OBJECT else _VALUE_OR_END
            continue
        if first in (_CLOSE_OBJECT, _CLOSE_LIST):
            run = token.translate(None, _SPACE)
            if expect not in (_NEXT, _NAME_OR_END, _VALUE_OR_END) or (
                len(run) > depth or closers[-len(run) :][::-1] != run
            ):
                return None
            del closers[-len(run) :]
            if depth > 1:  # the run ends a member's value, and perhaps the object too
                value.append(run if closers else run[: depth - 1])
        elif first == _COMMA:
            if expect != _NEXT:
                return None
            if len(token) > 1:  # more items of a list, which stays next to end or go on
                if closers[-1] != _CLOSE_LIST:
                    return None
                continue
            expect = _NAME if closers[-1] == _CLOSE_OBJECT else _VALUE
            continue
        elif expect not in (_VALUE, _VALUE_OR_END):
            return None  # a string or a literal where none may stand
        expect = _NEXT  # a value ended: a member's when it leaves the object alone open
        if len(closers) <= 1 and value:
            members.append((name, b"".join(value)))
            value.clear()
    return members if not closers and expect == _NEXT else None


def _readable_members(raw: str | bytes, exc: ValidationError, drops: _Drops) -> bytes:
    """The object `raw` as a text of its members that can be read and that the event is read
    from; each optional one that cannot be read is added to `drops`. Raises `EventError` when
    `raw` is not a JSON object, when a required field cannot be read, or when a field given
    twice cannot be read (which of its values counts would be a silent choice)."""
    text = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    members = _members(text)
    if members is None:
        raise EventError.from_validation(exc) from None
    kept: list[bytes] = []
    unreadable: dict[str, str] = {}
    seen: set[str] = set()
    for name_text, value in members:
        try:
            name = from_json(name_text)
        except ValueError:
            continue  # no name the event is read from: those are plain ASCII
        if name not in _READ_NAMES:
            continue  # unknown: ignored, whatever it holds
        twice = name in seen
        seen.add(name)
        try:
            from_json(b"[" + value + b"]")  # at the depth it has in the object
        except ValueError as err:
            unreadable[name] = f"unreadable JSON: {str(err).split(' at line ')[0]}"
        else:
            kept.append(name_text + b":" + value)
            if name not in unreadable:
                continue
        if twice:
            raise EventError("given twice with different values", _CANONICAL.get(name, name))
    for name, reason in unreadable.items():
        if name not in _DROPPABLE:
            raise EventError(reason, _CANONICAL.get(name, name))
        drops.setdefault(name, FieldDrop(name, reason))
    return b"{" + b",".join(kept) + b"}"


def parse_event_obj(obj: Mapping[str, Any], dropped: Iterable[FieldDrop] = ()) -> OwnershipEvent:
    """Validate a mapping (logfmt, typed emitter helpers) by the same JSON rules as the wire;
    `dropped` lists optional fields its reader already left out (the event lists them too).

    Going through JSON keeps one notion of valid: a time is an RFC 3339 string, never a number.
    """
    _names_agree(obj)
    drops = {d.field: d for d in dropped}
    try:
        raw = to_json(obj)
    except PydanticSerializationError:
        raw = to_json(_serialisable(obj, drops))
    try:
        event = _forget_names(OwnershipEvent.model_validate_json(raw))
    except ValidationError as exc:
        return _salvage(exc, lambda: from_json(raw), drops)
    return _without(event, drops)


def parse_event_strict(obj: Mapping[str, Any]) -> OwnershipEvent:
    """Validate an event where it is made (an emitter, the lease store's outbox): as
    `parse_event_obj`, but an invalid optional field is an `EventError` naming it too. A
    detector would drop the field and go on; whoever makes the event can fix it."""
    event = parse_event_obj(obj)
    if event.dropped_fields:
        drop = event.dropped_fields[0]
        raise EventError(drop.reason, drop.field)
    return event


def _serialisable(obj: Mapping[str, Any], drops: _Drops) -> dict[str, Any]:
    """The members of `obj` that the event is read from and that JSON can hold: an optional one
    that it cannot (a string with a lone surrogate, such as a logfmt byte that is not UTF-8) is
    added to `drops`, a required one costs the event, an unknown one is ignored."""
    kept: dict[str, Any] = {}
    for name, value in obj.items():
        if name not in _READ_NAMES:
            continue
        try:
            to_json(value)
        except PydanticSerializationError as exc:
            text = str(exc)
            reason = "not UTF-8" if "surrogates not allowed" in text else text
            if name not in _DROPPABLE:
                raise EventError(reason, _CANONICAL.get(name, name)) from None
            drops.setdefault(name, FieldDrop(name, reason))
        else:
            kept[name] = value
    return kept


def _forget_names(event: OwnershipEvent) -> OwnershipEvent:
    """Once checked, which names the input used is no part of the event: an event read from a
    job queue's log equals the same event read back from the wire."""
    if event.job_queue_name is not None:
        object.__setattr__(event, "job_queue_name", None)
    return event


def _names_agree(obj: Mapping[str, Any]) -> None:
    """One field given under two of its names must say one thing (DESIGN §3): choosing one of
    them would be silent. A null is no value, so it conflicts with none."""
    for name, aliases in FIELD_ALIASES.items():
        names = [n for n in (name, *aliases) if obj.get(n) is not None]
        values = [obj[n] for n in names]
        if any(type(v) is not type(values[0]) or v != values[0] for v in values[1:]):
            raise EventError(f"given twice with different values (as {', '.join(names)})", name)


def _salvage(exc: ValidationError, load: Callable[[], Any], drops: _Drops) -> OwnershipEvent:
    """The slow path of an event that failed validation: rejected if a required field is
    missing or invalid; otherwise validated again without its invalid optional fields and
    those `drops` already lists, all of which it names in `dropped_fields`. Also where a job
    queue's `tool_request_started` without an effect key takes its `request` as the key (else
    `tool_request`)."""
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        name = loc[0] if loc else None
        if isinstance(name, str) and name in _DROPPABLE:
            where = ".".join(str(p) for p in loc[1:])
            drops.setdefault(
                name, FieldDrop(name, f"{where}: {error['msg']}" if where else error["msg"])
            )
        elif error["type"] != _NEEDS_KEY:
            raise EventError.from_error(error) from None
    obj = load()
    if not isinstance(obj, dict):
        raise EventError.from_validation(exc) from None
    _names_agree(obj)
    if "effect_key" in drops and Kind(obj["kind"]) in EFFECT_KINDS:
        raise EventError(drops["effect_key"].reason, "effect_key")  # required for this kind
    for name in drops:
        obj.pop(name, None)
    if obj.get("kind") == TOOL_REQUEST_KIND and obj.get("effect_key") is None:
        request = obj.get(TOOL_REQUEST_FIELD)
        usable = isinstance(request, str) and 0 < len(request) <= MAX_KEY_CHARS
        if request is not None and not usable:
            drops[TOOL_REQUEST_FIELD] = FieldDrop(
                TOOL_REQUEST_FIELD,
                f"not usable as the effect key (a string of 1 to {MAX_KEY_CHARS} characters); "
                f"the key is {TOOL_REQUEST_KEY!r}",
            )
        obj["effect_key"] = request if usable else TOOL_REQUEST_KEY
    try:
        event = OwnershipEvent.model_validate_json(to_json(obj))
    except ValidationError as again:
        raise EventError.from_validation(again) from None
    if drops:
        object.__setattr__(event, "dropped_fields", tuple(drops.values()))
    return _forget_names(event)
