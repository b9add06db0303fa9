"""Lease health: a lease of duration L with heartbeat period H needs L > H + R*max(H, T) + J.

After the last heartbeat that succeeded, each of R missed ones holds the next back by a period,
or by up to T (how long a failed extension can take) if longer, and the one after them must find
the lease still held, with J to spare. Events carry L (`lease_duration_s`) and H
(`heartbeat_interval_s`) but no T: the check here is the rule with T <= H, L > (R+1)*H + J,
which every lease needs whatever its extensions take; a lease-store job class also counts T
when it is defined (`detector.leases.policy`).

Heartbeats prove reachability, not ownership; but a lease too tight for the heartbeat gaps a tool
class really shows will hand a live worker's workflow to another one — a split-brain we can warn
about before it happens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import ClassVar, Final, Literal

UNLABELLED: Final = "unlabelled"  # an event without the label
OTHER: Final = "other"  # a value that is no short label, or one beyond the cap

Labels = tuple[str, str, str]  # tool_class, model, provider: `LabelBounds.NAMES`
RawLabels = tuple[str | None, str | None, str | None]
_NO_LABELS: Final[RawLabels] = (None, None, None)
# Distinct values kept per label; later ones are counted as `other`.
MAX_LABEL_VALUES: Final = 32
_SHORT_LABEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+@-]{0,63}")

# Histogram bounds, in seconds (the last bucket, +Inf, is implied). A heartbeat that arrives
# after its lease ran out counts in the `0` bucket of the time remaining.
HEARTBEAT_AGE_BOUNDS: Final = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600)
LEASE_REMAINING_BOUNDS: Final = (0, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300)
# From the displaced epoch's last known `lease_until` to the takeover's `observed_at`: how long
# a workflow stayed without a live owner before the coordination store handed it on.
TAKEOVER_DELAY_BOUNDS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass(frozen=True, slots=True)
class LeaseWarning:
    tool_class: str
    reason: Literal["policy", "heartbeat_gap"]
    lease_duration_s: float
    heartbeat_interval_s: float | None
    observed_gap_s: float | None
    message: str


@dataclass(slots=True)
class ToolClassHealth:
    acquisitions: int = 0
    policy_violations: int = 0
    near_expiry: int = 0


class LabelBounds:
    """Label values fit for metrics: bounded, never a workflow key, worker id or effect key.

    Each label keeps at most `max_values` distinct values: a value that is no short label (1 to
    64 letters, digits and `_.:/+@-`), or one beyond the cap, becomes `other`; a missing one
    `unlabelled`. Equal labels come back as one tuple object, which many workflows can share.
    """

    NAMES: ClassVar = ("tool_class", "model", "provider")
    __slots__ = ("_known", "_values", "max_values")

    def __init__(self, max_values: int = MAX_LABEL_VALUES) -> None:
        self.max_values = max_values
        self._values: tuple[dict[str, str], ...] = tuple({} for _ in self.NAMES)
        # Labels as events give them, when bounding keeps them (or only fills in
        # `unlabelled`): bounded by the caps too, and found again in one lookup.
        self._known: dict[RawLabels, Labels] = {}

    def bound(self, raw: RawLabels) -> Labels:
        labels = self._known.get(raw)
        if labels is None:
            labels = (self._value(0, raw[0]), self._value(1, raw[1]), self._value(2, raw[2]))
            labels = self._known.setdefault(labels, labels)
            if all(r is None or r == b for r, b in zip(raw, labels, strict=True)):
                self._known[raw] = labels
        return labels

    def of_attrs(self, attrs: Mapping[str, str] | None) -> Labels:
        """The labels of an event's `attrs`."""
        if not attrs:
            return self.bound(_NO_LABELS)
        return self.bound((attrs.get("tool_class"), attrs.get("model"), attrs.get("provider")))

    def _value(self, i: int, raw: str | None) -> str:
        if not raw:
            return UNLABELLED
        admitted = self._values[i]
        value = admitted.get(raw)
        if value is not None:
            return value
        if raw in (UNLABELLED, OTHER):
            return UNLABELLED if raw == UNLABELLED else OTHER
        if len(admitted) >= self.max_values or not _SHORT_LABEL.fullmatch(raw):
            return OTHER
        value = admitted[raw] = intern(raw)
        return value


@dataclass(slots=True)
class LeaseStats:
    """Cumulative lease-health observations of one set of labels, for a worker to export as
    metrics (`detector.telemetry.metrics`); they decide nothing.

    The two histograms count per bucket, not cumulatively: index i counts the values above
    bound i-1 and at most bound i; the last index counts the values above every bound.

    Their values subtract emitters' times (`observed_at`, and `lease_until` from the
    coordination store's clock): clocks serve lease health only here, never a verdict.
    """

    HEARTBEAT_AGE_BOUNDS: ClassVar = HEARTBEAT_AGE_BOUNDS
    REMAINING_BOUNDS: ClassVar = LEASE_REMAINING_BOUNDS
    TAKEOVER_DELAY_BOUNDS: ClassVar = TAKEOVER_DELAY_BOUNDS

    labels: Labels
    # Time since the workflow's previous heartbeat (or its acquisition), when a heartbeat of
    # its current owner arrives.
    heartbeat_age: list[int] = field(default_factory=lambda: [0] * (len(HEARTBEAT_AGE_BOUNDS) + 1))
    heartbeat_age_sum: float = 0.0
    # The previous `lease_until` of the current epoch minus a heartbeat's `observed_at`.
    remaining: list[int] = field(default_factory=lambda: [0] * (len(LEASE_REMAINING_BOUNDS) + 1))
    remaining_sum: float = 0.0
    # A takeover (an acquisition of an epoch above every epoch acquired before) while the
    # previous epoch had not released its lease.
    expired: int = 0
    # Acquisitions of a new epoch of a workflow that had been acquired before.
    reclaimed: int = 0
    # Of those takeovers (`expired`) whose previous epoch's `lease_until` is known: the
    # takeover's `observed_at` minus it, when not negative ...
    takeover_delay: list[int] = field(
        default_factory=lambda: [0] * (len(TAKEOVER_DELAY_BOUNDS) + 1)
    )
    takeover_delay_sum: float = 0.0
    # ... and the takeovers before it: a lease broken while still valid (or the coordination
    # store's clock and the acquisition's disagree). Kept out of the histogram, whose low
    # buckets would otherwise read as prompt reclaims.
    early: int = 0
    lost: int = 0  # `lease_lost` (`heartbeat_lost`): an extension returned no row
    uncertain: int = 0  # `ownership_uncertain`: the coordination store did not answer


@dataclass(slots=True)
class LeaseHealth:
    """Per tool class (a bounded label) counts; each kind of warning is raised once per class.

    `stats` holds the lease-health observations per set of labels, bounded by `bounds`.
    """

    missed_heartbeats: int
    jitter_reserve_s: float
    bounds: LabelBounds = field(default_factory=LabelBounds)
    classes: dict[str, ToolClassHealth] = field(default_factory=dict)
    warnings: list[LeaseWarning] = field(default_factory=list)
    stats: dict[Labels, LeaseStats] = field(default_factory=dict)
    _warned: set[tuple[str, str]] = field(default_factory=set)

    def stats_of(self, raw: RawLabels) -> LeaseStats:
        """The observations of these labels, once bounded: one object per set of labels, whose
        `labels` is the one tuple the workflows with them keep."""
        labels = self.bounds.bound(raw)
        stats = self.stats.get(labels)
        if stats is None:
            stats = self.stats[labels] = LeaseStats(labels)
        return stats

    def stats_of_attrs(self, attrs: Mapping[str, str] | None) -> LeaseStats:
        """The observations of the labels of an event's `attrs`."""
        labels = self.bounds.of_attrs(attrs)
        stats = self.stats.get(labels)
        if stats is None:
            stats = self.stats[labels] = LeaseStats(labels)
        return stats

    def _cls(self, tool_class: str | None) -> ToolClassHealth:
        name = tool_class or UNLABELLED
        health = self.classes.get(name)
        if health is None:
            health = self.classes[name] = ToolClassHealth()
        return health

    def acquired(self, tool_class: str | None, lease_s: float | None, hb_s: float | None) -> None:
        health = self._cls(tool_class)
        health.acquisitions += 1
        if lease_s is None or hb_s is None:
            return
        periods = self.missed_heartbeats + 1
        needed = periods * hb_s + self.jitter_reserve_s
        if lease_s <= needed:
            health.policy_violations += 1
            if self._first(tool_class, "policy"):
                self.warnings.append(
                    LeaseWarning(
                        tool_class or UNLABELLED,
                        "policy",
                        lease_s,
                        hb_s,
                        None,
                        f"lease {lease_s:g}s is not longer than ({self.missed_heartbeats}+1) x "
                        f"{hb_s:g}s heartbeat + {self.jitter_reserve_s:g}s jitter = {needed:g}s "
                        "(L > H + R x max(H, T) + J; the events carry no T, a failed "
                        "extension's time, so it is taken as H): a worker that misses "
                        f"{self.missed_heartbeats} heartbeats loses its lease while alive",
                    )
                )

    def near_expiry(self, tool_class: str | None, gap_s: float, lease_s: float) -> None:
        """A heartbeat gap came within the jitter reserve of the lease (gap + J >= L).

        The engine tests that condition itself on every heartbeat: a call per heartbeat would
        cost more than the test.
        """
        self._cls(tool_class).near_expiry += 1
        if self._first(tool_class, "heartbeat_gap"):
            self.warnings.append(
                LeaseWarning(
                    tool_class or UNLABELLED,
                    "heartbeat_gap",
                    lease_s,
                    None,
                    gap_s,
                    f"a heartbeat gap of {gap_s:g}s came within {self.jitter_reserve_s:g}s "
                    f"of the {lease_s:g}s lease: lengthen the lease or shorten the "
                    "heartbeat period",
                )
            )

    def _first(self, tool_class: str | None, reason: str) -> bool:
        """Each kind of warning once per tool class: the counters carry the rest."""
        key = (tool_class or UNLABELLED, reason)
        if key in self._warned:
            return False
        self._warned.add(key)
        return True
