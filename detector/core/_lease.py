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

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal

from detector.contracts.events import OwnershipEvent

from ._labels import LabelBounds, Labels, RawLabels
from ._records import AcquisitionRecord
from ._state import LEASE_RELEASED, WorkflowState

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


# Lease durations kept as one shared float object each (`LeaseHealth._shared_lease`).
_MAX_SHARED_LEASES: Final = 1024


@dataclass(slots=True)
class LeaseHealth:
    """Lease-health observations of one engine: `stats` per set of labels (bounded by
    `bounds`) for metrics, and `warnings`, each kind once per tool class (a bounded label).

    The engine calls it once per acquisition, heartbeat, release, lease loss or uncertain
    ownership; it keeps the workflow's lease fields (`WorkflowState.labels`, `lease_s`,
    `hb_obs`, `lease_until`), which decide no verdict.
    """

    missed_heartbeats: int
    jitter_reserve_s: float
    bounds: LabelBounds = field(default_factory=LabelBounds)
    warnings: list[LeaseWarning] = field(default_factory=list)
    stats: dict[Labels, LeaseStats] = field(default_factory=dict)
    _warned: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)
    _lease_values: dict[float, float] = field(default_factory=dict, init=False, repr=False)

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

    # ---- one call per event of a lease kind -------------------------------------------------

    def acquired(
        self,
        st: WorkflowState,
        acq: AcquisitionRecord,
        event: OwnershipEvent,
        top: int,
        new_epoch: bool,
    ) -> None:
        """An acquisition the engine kept: `top` is the highest epoch acquired before it, and
        `new_epoch` whether no acquisition of its epoch was known."""
        stats = self.stats_of_attrs(event.attrs)
        if new_epoch and top >= 0:
            stats.reclaimed += 1
            # A takeover while the previous epoch held its lease: it expired, or was broken.
            # Known only when the takeover arrives after that epoch's events.
            if acq.epoch > top and st.lease_until != LEASE_RELEASED:
                stats.expired += 1
                expiry = st.lease_until  # of the displaced epoch `top`, if known
                if expiry is not None and acq.obs is not None:
                    delay = acq.obs - expiry
                    if delay >= 0:
                        stats.takeover_delay[bisect_left(TAKEOVER_DELAY_BOUNDS, delay)] += 1
                        stats.takeover_delay_sum += delay
                    else:
                        stats.early += 1
        if acq.epoch >= st.top:
            st.labels = stats.labels
            st.lease_s = self._shared_lease(event.lease_duration_s)
            st.hb_obs = acq.obs
            until = event.lease_until
            st.lease_until = None if until is None else until.timestamp()
            self._check_policy(stats.labels[0], event.lease_duration_s, event.heartbeat_interval_s)

    def heartbeat(
        self, st: WorkflowState, epoch: int, obs: float | None, event: OwnershipEvent
    ) -> None:
        """Heartbeat age and lease time remaining, on the emitters' clocks: for lease health
        only, never for a verdict (DESIGN §4: clocks never decide)."""
        acqs = st.acqs
        top = acqs[-1].epoch if acqs else -1
        if epoch < top:
            return  # a displaced owner's heartbeats are no gaps of the lease
        until = st.lease_until  # of the current epoch (`top`)
        if obs is not None:
            labels = st.labels
            stats = None if labels is None else self.stats.get(labels)
            if stats is None or stats.labels is not labels:
                stats = self._stats_of_state(st, event.attrs)
            last = st.hb_obs
            st.hb_obs = obs
            if last is not None and obs >= last:
                gap = obs - last
                stats.heartbeat_age[bisect_left(HEARTBEAT_AGE_BOUNDS, gap)] += 1
                stats.heartbeat_age_sum += gap
                lease = st.lease_s
                # Tested inline: a call per heartbeat would cost more than the test.
                if lease is not None and gap > 0 and gap + self.jitter_reserve_s >= lease:
                    self._near_expiry(stats.labels[0], gap, lease)
            if until is not None and epoch == top and until != LEASE_RELEASED:
                left = until - obs
                stats.remaining[bisect_left(LEASE_REMAINING_BOUNDS, left)] += 1
                stats.remaining_sum += left
        extended = event.lease_until
        if extended is not None:
            if epoch == top and until != LEASE_RELEASED:
                st.lease_until = extended.timestamp()
        elif until is not None and epoch == top and until != LEASE_RELEASED:
            st.lease_until = None  # extended, until when is not known

    def released(self, st: WorkflowState) -> None:
        """The current epoch released its lease (the engine checks the epoch)."""
        st.lease_until = LEASE_RELEASED

    def lost(self, st: WorkflowState, attrs: Mapping[str, str] | None) -> None:
        """`lease_lost`: an extension returned no row."""
        self._stats_of_state(st, attrs).lost += 1

    def uncertain(self, st: WorkflowState, attrs: Mapping[str, str] | None) -> None:
        """`ownership_uncertain`: the coordination store did not answer."""
        self._stats_of_state(st, attrs).uncertain += 1

    # ---- inside -----------------------------------------------------------------------------

    def _stats_of_state(self, st: WorkflowState, attrs: Mapping[str, str] | None) -> LeaseStats:
        """The observations of the workflow's labels: its acquisition's, else those of this
        event's `attrs` (kept until an acquisition brings its own)."""
        labels = st.labels
        if labels is not None:
            stats = self.stats.get(labels)
            if stats is not None:
                if stats.labels is not labels:
                    st.labels = stats.labels  # restored: share the one tuple again
                return stats
            stats = self.stats_of(labels)  # restored, or by another engine: bound them
        else:
            stats = self.stats_of_attrs(attrs)
        st.labels = stats.labels
        return stats

    def _shared_lease(self, lease_s: float | None) -> float | None:
        """Deployments use a handful of lease durations: one float object each, not one per
        workflow."""
        if lease_s is None:
            return None
        shared = self._lease_values.get(lease_s)
        if shared is not None:
            return shared
        if len(self._lease_values) < _MAX_SHARED_LEASES:
            self._lease_values[lease_s] = lease_s
        return lease_s

    def _check_policy(self, tool_class: str, lease_s: float | None, hb_s: float | None) -> None:
        """Warn once per tool class of a lease too short for its heartbeat period."""
        if lease_s is None or hb_s is None:
            return
        periods = self.missed_heartbeats + 1
        needed = periods * hb_s + self.jitter_reserve_s
        if lease_s <= needed and self._first(tool_class, "policy"):
            self.warnings.append(
                LeaseWarning(
                    tool_class,
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

    def _near_expiry(self, tool_class: str, gap_s: float, lease_s: float) -> None:
        """A heartbeat gap came within the jitter reserve of the lease (gap + J >= L)."""
        if self._first(tool_class, "heartbeat_gap"):
            self.warnings.append(
                LeaseWarning(
                    tool_class,
                    "heartbeat_gap",
                    lease_s,
                    None,
                    gap_s,
                    f"a heartbeat gap of {gap_s:g}s came within {self.jitter_reserve_s:g}s "
                    f"of the {lease_s:g}s lease: lengthen the lease or shorten the "
                    "heartbeat period",
                )
            )

    def _first(self, tool_class: str, reason: str) -> bool:
        """Each kind of warning once per tool class."""
        key = (tool_class, reason)
        if key in self._warned:
            return False
        self._warned.add(key)
        return True
