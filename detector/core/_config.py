"""The engine's settings: each one a `Config` field, declared once with its bound and meaning."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from math import isnan
from typing import Any, Final

from ._labels import MAX_LABEL_VALUES

# The findings topic's retention (topics/topics.yaml, 14 days) and one segment's roll (1 day
# there): a record is deleted with its segment, at most one roll after its retention.
FINDINGS_VISIBLE_S: Final = 15 * 24 * 3600.0


class Bound(StrEnum):
    """The least value an engine setting takes: caps and counts below 1, and periods of 0, would
    make the engine forget or decide at once. The worker's flag takes its form from it."""

    AT_LEAST_ONE = "be at least 1"
    MORE_THAN_ZERO = "be more than 0"
    NOT_NEGATIVE = "not be negative"

    def allows(self, value: float) -> bool:
        if self is Bound.AT_LEAST_ONE:
            return value >= 1
        return value > 0 if self is Bound.MORE_THAN_ZERO else value >= 0


def _setting(default: Any, bound: Bound, meaning: str) -> Any:
    """A `Config` field, declared once: its default, its bound (checked here, and by the worker's
    flag) and its meaning (the flag's help and the configuration reference)."""
    return field(default=default, metadata={"bound": bound, "meaning": meaning})


@dataclass(frozen=True, slots=True)
class Config:
    """Bounds and policies. Caps bound memory; when one cuts evidence a verdict may depend on,
    the verdict says so (`evidence_truncated`).

    Each field is also a `splitbrain worker` flag and variable (`detector.cli.worker` makes them
    from these fields), so an engine setting is added here and nowhere else."""

    max_evidence: int = _setting(
        32,
        Bound.AT_LEAST_ONE,
        "raw events kept per workflow for a late acquisition to look back at",
    )
    max_acquisitions: int = _setting(16, Bound.AT_LEAST_ONE, "acquisitions kept per workflow")
    max_effect_keys: int = _setting(
        256, Bound.AT_LEAST_ONE, "effect keys kept per workflow and tracked per finding"
    )
    max_event_ids: int = _setting(
        256, Bound.AT_LEAST_ONE, "event ids remembered per workflow to recognise a redelivery"
    )
    quiet_period_s: float = _setting(
        600.0,
        Bound.MORE_THAN_ZERO,
        "silence (this worker's clock) that counts as fenced, in seconds",
    )
    clock_skew_s: float = _setting(
        3600.0,
        Bound.MORE_THAN_ZERO,
        "audit only: how far ahead an uncorroborated observed_at is still believed, in seconds",
    )
    idle_ttl_s: float = _setting(
        7 * 24 * 3600.0,
        Bound.MORE_THAN_ZERO,
        "a workflow with no events for this long is forgotten, in seconds",
    )
    # `advance` looks at every workflow only this often; in between, only at workflows with an
    # open finding or a release, so a tick costs little at millions of states.
    idle_sweep_s: float = _setting(
        3600.0, Bound.NOT_NEGATIVE, "how often every workflow is checked for idleness, in seconds"
    )
    # A remnant (`WorkflowState.remnant`) is removed this long after it was made: by then no
    # reader of the findings topic can still see its findings' revisions, so a finding of its
    # workflow may start again at revision 1 (README "Forgotten workflows"). A day of margin.
    remnant_ttl_s: float = _setting(
        FINDINGS_VISIBLE_S + 24 * 3600.0,
        Bound.MORE_THAN_ZERO,
        "a forgotten workflow's remnant is removed this long after it was made, in seconds; at "
        "least the findings topic's retention.ms + segment.ms, so no reader still sees the "
        "revisions of its findings",
    )
    # R and J: DESIGN §4, R=1 the practice's own example.
    missed_heartbeats: int = _setting(
        1, Bound.AT_LEAST_ONE, "R of the lease rule L > (R+1) x H + J"
    )
    jitter_reserve_s: float = _setting(
        20.0, Bound.NOT_NEGATIVE, "J of the lease rule L > (R+1) x H + J, in seconds"
    )
    max_label_values: int = _setting(
        MAX_LABEL_VALUES,
        Bound.AT_LEAST_ONE,
        "distinct values kept per lease-health metric label (tool_class, model, provider); "
        "the rest are counted as other",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or isnan(value):
                raise ValueError(f"{f.name} must be a number, not {value!r}")
            bound: Bound = f.metadata["bound"]
            if not bound.allows(value):
                raise ValueError(f"{f.name} must {bound}, not {value!r}")

    @classmethod
    def for_audit(cls, **overrides: Any) -> Config:
        """Caps that keep histories of thousands of events per workflow exact: `audit` holds
        one history, not a fleet's worth of workflows."""
        caps: dict[str, Any] = {
            "max_evidence": 100_000,
            "max_acquisitions": 10_000,
            "max_effect_keys": 100_000,
            "max_event_ids": 200_000,
        }
        return cls(**{**caps, **{k: v for k, v in overrides.items() if v is not None}})
