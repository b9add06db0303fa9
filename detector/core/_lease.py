"""Lease health: a lease of duration L with heartbeat period H needs L > R*H + J.

Heartbeats prove reachability, not ownership; but a lease too tight for the heartbeat gaps a tool
class really shows will hand a live worker's workflow to another one — a split-brain we can warn
about before it happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

UNLABELLED = "unlabelled"


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


@dataclass(slots=True)
class LeaseHealth:
    """Per tool class (a bounded label) counts; each kind of warning is raised once per class."""

    missed_heartbeats: int
    jitter_reserve_s: float
    classes: dict[str, ToolClassHealth] = field(default_factory=dict)
    warnings: list[LeaseWarning] = field(default_factory=list)
    _warned: set[tuple[str, str]] = field(default_factory=set)

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
        needed = self.missed_heartbeats * hb_s + self.jitter_reserve_s
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
                        f"lease {lease_s:g}s is not longer than {self.missed_heartbeats} x "
                        f"{hb_s:g}s heartbeat + {self.jitter_reserve_s:g}s jitter = {needed:g}s: "
                        f"a worker that misses {self.missed_heartbeats} heartbeats loses its "
                        "lease while alive",
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
