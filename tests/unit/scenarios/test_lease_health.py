"""Lease health: policy warnings and heartbeat gaps near expiry."""

from __future__ import annotations

import pytest

from ..histories import EventFields, W, acq, ev, run


@pytest.mark.parametrize(
    ("lease", "hb", "warned"),
    # DESIGN §4's defaults, R = 1 and J = 20 s: the practice's own 90 s lease with a 30 s
    # heartbeat is healthy (30 + 30 + 20 = 80 < 90), its 35 s lease is not.
    [(35, 30, True), (65, 30, True), (80, 30, True), (80.5, 30, False), (90, 30, False)],
)
def test_lease_policy_warning_when_lease_not_longer_than_two_heartbeats_plus_jitter(
    lease: float, hb: float, warned: bool
) -> None:
    r = run(
        [
            acq(
                "a",
                1,
                "w",
                1,
                lease_duration_s=lease,
                heartbeat_interval_s=hb,
                attrs={"tool_class": "browser"},
            )
        ]
    )
    ws = r.detector.lease_health.warnings
    assert [(w.tool_class, w.reason) for w in ws] == ([("browser", "policy")] if warned else [])
    assert r.findings() == []


def test_heartbeat_gap_close_to_lease_expiry_warns_per_tool_class() -> None:
    export = {"tool_class": "export"}
    r = run(
        [
            acq("a", 1, "w", 1, t=0, lease_duration_s=90, heartbeat_interval_s=25, attrs=export),
            ev("h1", "heartbeat", W, 1, "w", seq=2, t=30),
            ev("h2", "heartbeat", W, 1, "w", seq=3, t=60),
            ev("h3", "heartbeat", W, 1, "w", seq=4, t=125),  # gap 65 s: 20 s jitter short of 90
        ]
    )
    assert r.detector.lease_health.warnings == []
    r.feed([ev("h4", "heartbeat", W, 1, "w", seq=5, t=200)])  # gap 75 s: within the reserve
    (w,) = r.detector.lease_health.warnings
    assert (w.tool_class, w.reason, w.observed_gap_s) == ("export", "heartbeat_gap", 75.0)
    # a second gap of the same class does not repeat the warning
    r.feed([ev("h5", "heartbeat", W, 1, "w", seq=6, t=280)])
    assert len(r.detector.lease_health.warnings) == 1


def test_displaced_heartbeats_do_not_count_as_gaps_of_the_current_owner() -> None:
    lease: EventFields = {
        "lease_duration_s": 90,
        "heartbeat_interval_s": 25,  # 90 > (1+1) x 25 + 20: no policy warning
        "attrs": {"tool_class": "x"},
    }
    r = run(
        [
            acq("a1", 1, "alpha", 1, t=0, **lease),
            acq("a2", 2, "beta", 2, t=10, **lease),
            ev("h1", "heartbeat", W, 2, "beta", seq=3, t=40),
            ev("s1", "heartbeat", W, 1, "alpha", seq=4, t=500),  # stale, far later
            ev("h2", "heartbeat", W, 2, "beta", seq=5, t=70),
        ]
    )
    assert r.detector.lease_health.warnings == []
    assert r.finding(W, 1).severity.value == "info"
