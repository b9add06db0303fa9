"""The input contract `splitbrain.ownership/v1`: one ownership or effect event.

Validation happens here, at the edge, so that the rules in `detector.core` can trust every field.
Job-queue vocabularies (kind and field aliases) are folded into the canonical names on the way in.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Final

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
from pydantic_core import PydanticSerializationError, to_json

SCHEMA: Final = "splitbrain.ownership/v1"
MAX_DETAIL_BYTES: Final = 4096
MAX_EPOCH: Final = 2**63 - 1


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

EFFECT_KINDS: Final = frozenset(
    {Kind.EFFECT_ATTEMPTED, Kind.EFFECT_COMMITTED, Kind.EFFECT_REJECTED, Kind.OUTCOME_VERIFIED}
)


def _detail_fits(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_DETAIL_BYTES:
            raise ValueError(f"detail is {size} bytes serialised; the limit is {MAX_DETAIL_BYTES}")
    return value


ShortLabel = Annotated[str, Field(max_length=128)]


class OwnershipEvent(BaseModel):
    """One fact about who owns a workflow, or what an owner did to the outside world."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, str_strip_whitespace=False
    )

    event_id: Annotated[str, Field(min_length=1, max_length=128)]
    kind: Kind
    workflow_key: Annotated[
        str,
        Field(min_length=1, max_length=512, validation_alias=AliasChoices("workflow_key", "job")),
    ]
    owner_epoch: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_EPOCH,
            strict=True,
            validation_alias=AliasChoices("owner_epoch", "token", "fencing_token"),
        ),
    ]
    worker_id: Annotated[
        str,
        Field(
            min_length=1,
            max_length=256,
            validation_alias=AliasChoices("worker_id", "worker", "owner_id"),
        ),
    ]
    seq: Annotated[int | None, Field(ge=0, le=MAX_EPOCH, strict=True)] = None
    source: Source = Source.WORKER
    observed_at: Annotated[AwareDatetime | None, Field(strict=True)] = None
    effect_key: Annotated[str | None, Field(min_length=1, max_length=512)] = None
    destination: Annotated[str | None, Field(max_length=256)] = None
    lease_until: Annotated[AwareDatetime | None, Field(strict=True)] = None
    lease_duration_s: Annotated[float | None, Field(gt=0)] = None
    heartbeat_interval_s: Annotated[float | None, Field(gt=0)] = None
    attrs: Annotated[dict[ShortLabel, ShortLabel] | None, Field(max_length=16)] = None
    detail: Annotated[dict[str, Any] | None, AfterValidator(_detail_fits)] = None
    trace_id: Annotated[str | None, Field(pattern=r"^[0-9a-f]{32}$")] = None
    span_id: Annotated[str | None, Field(pattern=r"^[0-9a-f]{16}$")] = None

    @model_validator(mode="after")
    def _effect_needs_key(self) -> OwnershipEvent:
        if self.effect_key is None and self.kind in EFFECT_KINDS:
            if self.kind is not Kind.EFFECT_REJECTED:
                raise ValueError(f"effect_key is required for kind {self.kind.value}")
            object.__setattr__(self, "effect_key", REJECTED_RESULT_KEY)
        return self

    def observed_ts(self) -> float | None:
        """The emitter's clock as epoch seconds: for freshness and lag, never for ordering."""
        return None if self.observed_at is None else self.observed_at.timestamp()


class EventError(ValueError):
    """An input that is not a valid event, with the field and reason to report or dead-letter."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason if field is None else f"{field}: {reason}")
        self.reason = reason
        self.field = field

    @classmethod
    def from_validation(cls, exc: ValidationError) -> EventError:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        return cls(first["msg"], field)


def parse_event_json(raw: str | bytes) -> OwnershipEvent:
    """Parse one JSON object into an event, or raise `EventError` naming the field."""
    try:
        return OwnershipEvent.model_validate_json(raw)
    except ValidationError as exc:
        raise EventError.from_validation(exc) from None


def parse_event_obj(obj: dict[str, Any]) -> OwnershipEvent:
    """Validate a mapping (logfmt, typed emitter helpers) by the same JSON rules as the wire.

    Going through JSON keeps one notion of valid: a time is an RFC 3339 string, never a number.
    """
    try:
        return OwnershipEvent.model_validate_json(to_json(obj))
    except (ValidationError, PydanticSerializationError) as exc:
        if isinstance(exc, ValidationError):
            raise EventError.from_validation(exc) from None
        raise EventError(f"not serialisable as JSON: {exc}") from None
