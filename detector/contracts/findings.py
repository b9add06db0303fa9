"""The output contract `splitbrain.finding/v1`: one split-brain episode, published as revisions.

Readers keep the latest revision per `finding_id`; every revision is a whole document so that a
reader that missed earlier ones still has everything the on-call human needs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA: Final = "splitbrain.finding/v1"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK: Final = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class ConditionKind(StrEnum):
    STALE_ACTIVITY = "stale_activity"
    STALE_EFFECT_REJECTED = "stale_effect_rejected"
    STALE_EFFECT_ATTEMPT = "stale_effect_attempt"
    STALE_EFFECT_COMMITTED = "stale_effect_committed"
    DUPLICATE_EFFECT = "duplicate_effect"


class Status(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Owner(_Frozen):
    worker_id: str
    owner_epoch: int


class EventRef(_Frozen):
    event_id: str
    seq: int | None


class StaleEventRef(EventRef):
    kind: str


def _absent(value: object) -> bool:
    return value is None


def _zero(value: object) -> bool:
    return value == 0


class Condition(_Frozen):
    """Optional facts (effect key, cause, epochs) are left out when they do not apply."""

    kind: ConditionKind
    event_id: str
    seq: int | None
    effect_key: str | None = Field(default=None, exclude_if=_absent)
    cause: Literal["failover", "retry"] | None = Field(default=None, exclude_if=_absent)
    epochs: list[int] | None = Field(default=None, exclude_if=_absent)


# A finding's `context` (DESIGN §5): at most this many entries per side, each key and value at
# most this many characters (a longer one is cut and ends in "…").
MAX_CONTEXT_ENTRIES: Final = 16
MAX_CONTEXT_CHARS: Final = 128
_ContextText = Annotated[str, Field(max_length=MAX_CONTEXT_CHARS)]
ContextSide = Annotated[dict[_ContextText, _ContextText], Field(max_length=MAX_CONTEXT_ENTRIES)]


class FindingContext(_Frozen):
    """The source system's own words for the work and its owners, as an adapter or emitter put
    them in `attrs` and `detail` (a task or activity name, an attempt number, a lease's name,
    the cause of a move). Three sides, each left out when there is nothing to show: the
    displaced owner's acquisition, the event of the finding's latest condition, and the current
    owner's acquisition. `attrs` come first, then `detail`, each sorted by key; a `detail` value
    that is no string is written as JSON writes it (`1`, `true`), a nested one as compact JSON."""

    displaced: ContextSide | None = Field(default=None, exclude_if=_absent)
    latest_condition: ContextSide | None = Field(default=None, exclude_if=_absent)
    current: ContextSide | None = Field(default=None, exclude_if=_absent)


class EvidenceLag(_Frozen):
    """How far after the takeover the latest stale evidence happened."""

    seq: int | None
    seconds: float | None


class Finding(_Frozen):
    """One workflow, one displaced epoch (or one retried effect under a single epoch)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_: Literal["splitbrain.finding/v1"] = Field(default=SCHEMA, alias="schema")
    finding_id: str
    revision: int = Field(ge=1)
    status: Status
    severity: Severity
    workflow_key: str
    displaced: Owner | None
    current: Owner | None
    transition: EventRef | None
    conditions: list[Condition]
    last_stale_event: StaleEventRef | None
    effect_keys: list[str]
    sink_outcome: Literal["committed", "attempted", "rejected", "none"]
    ordering: Literal["authoritative_seq", "arrival"]
    confidence: Literal["high", "medium", "low"]
    evidence_lag: EvidenceLag | None
    response: str
    trace_links: list[str] = Field(default_factory=list)
    # Optional for readers (absent means false / 0): a retention cap cut evidence this verdict
    # may depend on; and how many conditions and effect keys the bounded lists leave out.
    evidence_truncated: bool = False
    conditions_omitted: int = Field(default=0, ge=0, exclude_if=_zero)
    effect_keys_omitted: int = Field(default=0, ge=0, exclude_if=_zero)
    # Optional for readers (absent means none): the source system's words (`FindingContext`).
    context: FindingContext | None = Field(default=None, exclude_if=_absent)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)
