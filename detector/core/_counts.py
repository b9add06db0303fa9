"""What the engine counts, for a worker to export as metrics: they decide nothing."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import ClassVar, Final

from detector.contracts.findings import Severity


@dataclass(slots=True)
class Counters:
    events: int = 0
    redelivered: int = 0
    id_conflicts: int = 0  # a seen event id came again with other content
    # Forgotten at the caps: raw activity and other raw events are routine for long workflows
    # (their verdicts live on in compact form); a forgotten effect key or acquisition can hide
    # a duplicate or a late displacement.
    activity_dropped: int = 0
    events_dropped: int = 0
    effects_dropped: int = 0
    acquisitions_dropped: int = 0
    ids_dropped: int = 0
    workflows_truncated: int = 0
    times_disbelieved: int = 0
    evicted_released: int = 0
    evicted_idle: int = 0
    evicted_expired: int = 0  # remnants removed at `remnant_ttl_s`
    revisions: int = 0
    findings_opened: int = 0


# Histogram bounds of `FindingStats` (the last bucket, +Inf, is implied).
ZOMBIE_SECONDS_BOUNDS: Final = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
ZOMBIE_SEQ_BOUNDS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000)
RESOLUTION_BOUNDS: Final = (
    *(1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600),
    *(7200, 14400, 43200, 86400, 259200, 604800),
)


@dataclass(slots=True)
class Observations:
    """One histogram's observations: `counts[i]` counts the values above bound i-1 and at most
    bound i (not cumulatively), the last index those above every bound; `total` their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


def _by_severity(bounds: tuple[float, ...]) -> dict[Severity, Observations]:
    return {severity: Observations(bounds) for severity in Severity}


@dataclass(slots=True)
class FindingStats:
    """Cumulative observations of findings by the severity of the revision that made them, for
    a worker to export as metrics (`detector.telemetry.metrics`); they decide nothing. Each is
    made once per change of status, so a revision that changes nothing else costs nothing here.

    When a finding resolves (its first resolved revision, or again after a reopening):
    - `zombie_seconds` and `zombie_seq`: how long its displaced owner went on acting after the
      takeover, as the resolving revision's `evidence_lag` says: its last stale event minus the
      transition, in `observed_at` seconds (none when a time is missing or the difference is
      negative: emitters' clocks, for a metric only) and in `seq` (only with `ordering:
      authoritative_seq`). A finding without a displaced owner's stale event (a retry, a
      duplicate after a clean handoff) has none;
    - `resolution`: the caller's time (`at`, a worker's processing clock) from the revision that
      opened the finding, or reopened it, to the one that resolved it. None without `at`
      (`audit`), for a finding published resolved at once, or opened before a worker kept the
      time (a state restored from an older version).
    """

    ZOMBIE_SECONDS_BOUNDS: ClassVar = ZOMBIE_SECONDS_BOUNDS
    ZOMBIE_SEQ_BOUNDS: ClassVar = ZOMBIE_SEQ_BOUNDS
    RESOLUTION_BOUNDS: ClassVar = RESOLUTION_BOUNDS

    zombie_seconds: dict[Severity, Observations] = field(
        default_factory=lambda: _by_severity(ZOMBIE_SECONDS_BOUNDS)
    )
    zombie_seq: dict[Severity, Observations] = field(
        default_factory=lambda: _by_severity(ZOMBIE_SEQ_BOUNDS)
    )
    resolution: dict[Severity, Observations] = field(
        default_factory=lambda: _by_severity(RESOLUTION_BOUNDS)
    )
