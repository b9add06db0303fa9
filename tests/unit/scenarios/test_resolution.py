"""Resolution: fenced and verified, the quiet period, and reopening."""

from __future__ import annotations

import pytest

from detector.core import Config

from ..histories import (
    K,
    W,
    acq,
    at,
    commit,
    conds,
    ev,
    run,
    stale_commit,
    takeover,
    verify,
)


def test_fenced_alone_does_not_resolve() -> None:
    r = run([*stale_commit(), ev("lost", "lease_lost", W, 17, "alpha", seq=7)])
    assert r.finding(W, 17).status.value == "open"


def test_verified_alone_does_not_resolve() -> None:
    r = run([*stale_commit(), verify("v", 7)])
    assert r.finding(W, 17).status.value == "open"


@pytest.mark.parametrize("fence", ["lease_lost", "lease_released"])
def test_fenced_and_verified_resolves_keeping_severity(fence: str) -> None:
    r = run([*stale_commit(), ev("f", fence, W, 17, "alpha", seq=7), verify("v", 8)])
    f = r.finding(W, 17)
    assert (f.status.value, f.severity.value, f.revision) == ("resolved", "critical", 2)


def test_stale_activity_only_resolves_on_fence_alone() -> None:
    r = run(
        [
            *takeover(),
            ev("hb", "heartbeat", W, 17, "alpha", seq=6),
            ev("f", "lease_lost", W, 17, "alpha", seq=7),
        ]
    )
    assert r.finding(W, 17).status.value == "resolved"


def test_resolution_evidence_must_come_after_the_stale_evidence() -> None:
    # lease_lost and the verification both predate the last stale event
    r = run(
        [
            *takeover(),
            commit("c", 17, "alpha", 6),
            verify("v", 7),
            ev("f", "lease_lost", W, 17, "alpha", seq=8),
            ev("hb", "heartbeat", W, 17, "alpha", seq=9),
        ]
    )
    assert r.finding(W, 17).status.value == "open"
    # verification before the commit on that key does not count either
    r = run(
        [
            *takeover(),
            verify("v", 6),
            commit("c", 17, "alpha", 7),
            ev("f", "lease_lost", W, 17, "alpha", seq=8),
        ]
    )
    assert r.finding(W, 17).status.value == "open"


def test_ownership_uncertain_is_not_fence_evidence_and_worker_verification_does_not_count() -> None:
    r = run(
        [
            *stale_commit(),
            ev("u", "ownership_uncertain", W, 17, "alpha", seq=7),
            verify("v", 8),
            ev("wv", "outcome_verified", W, 18, "beta", seq=9, key=K, source="worker"),
        ]
    )
    assert r.finding(W, 17).status.value == "open"
    r.feed([ev("f", "lease_lost", W, 17, "alpha", seq=10)])
    assert r.finding(W, 17).status.value == "resolved"
    r2 = run(
        [
            *stale_commit(),
            ev("f", "lease_lost", W, 17, "alpha", seq=7),
            ev("wv", "outcome_verified", W, 18, "beta", seq=8, key=K, source="worker"),
        ]
    )
    assert r2.finding(W, 17).status.value == "open"


def test_every_effect_key_must_be_verified() -> None:
    r = run(
        [
            *takeover(),
            commit("c1", 17, "alpha", 6, key="k1"),
            ev("x", "effect_attempted", W, 17, "alpha", seq=7, key="k2"),
            ev("f", "lease_lost", W, 17, "alpha", seq=8),
            verify("v1", 9, key="k1"),
        ]
    )
    assert r.finding(W, 17).status.value == "open"
    r.feed([verify("v2", 10, key="k2")])
    assert r.finding(W, 17).status.value == "resolved"


def test_verification_arriving_before_the_evidence_it_follows_still_resolves() -> None:
    r = run([verify("v", 8), ev("f", "lease_lost", W, 17, "alpha", seq=7), *stale_commit()])
    assert r.finding(W, 17).status.value == "resolved"


def test_destination_rejection_after_a_stale_commit_fences() -> None:
    # alpha commits K at a destination that ignores the fence; its next write to K is rejected
    # by a destination that enforces it; a verifier then confirms K: fenced and verified.
    r = run(
        [
            *takeover(),
            commit("c", 17, "alpha", 6),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=7, key=K, source="destination"),
        ]
    )
    assert r.finding(W, 17).status.value == "open"
    r.feed([verify("v", 8)])
    f = r.finding(W, 17)
    assert (f.status.value, f.severity.value) == ("resolved", "critical")


def test_destination_rejection_of_the_only_attempt_fences() -> None:
    r = run(
        [
            *takeover(),
            ev("x", "effect_attempted", W, 17, "alpha", seq=6, key=K),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=7, key=K, source="destination"),
            verify("v", 8),
        ]
    )
    assert r.finding(W, 17).status.value == "resolved"


def test_rejection_fences_only_what_came_before_it() -> None:
    r = run(
        [
            *takeover(),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=6, key=K, source="destination"),
            ev("hb", "heartbeat", W, 17, "alpha", seq=7),
            verify("v", 8),
        ]
    )
    assert r.finding(W, 17).status.value == "open"
    r.feed([ev("f", "lease_lost", W, 17, "alpha", seq=9)])
    assert r.finding(W, 17).status.value == "resolved"


def test_worker_reported_rejection_is_not_fence_evidence() -> None:
    r = run(
        [
            *stale_commit(),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=7, key=K, source="worker"),
            ev("rj2", "effect_rejected", W, 17, "alpha", seq=8, key=K, source="worker"),
            verify("v", 9),
        ]
    )
    assert r.finding(W, 17).status.value == "open"


def test_failover_duplicate_after_clean_handoff_resolves_when_verified() -> None:
    wf = "report-index"
    r = run(
        [
            acq("a5", 5, "delta", 1, wf),
            commit("c5", 5, "delta", 2, key="s1", wf=wf),
            acq("a6", 6, "epsilon", 3, wf),
            commit("c6", 6, "epsilon", 4, key="s1", wf=wf),
        ]
    )
    assert r.finding(wf, 5).status.value == "open"
    r.feed([verify("v", 5, key="s1", wf=wf, epoch=6)])
    assert r.finding(wf, 5).status.value == "resolved"


def test_retry_finding_resolves_when_verified() -> None:
    r = run([acq("a1", 1, "w", 1), commit("c1", 1, "w", 2), commit("c2", 1, "w", 3)])
    assert r.finding(W, None).status.value == "open"
    r.feed([verify("v", 4, epoch=1)])
    assert r.finding(W, None).status.value == "resolved"


def test_quiet_period_resolves_via_advance_and_new_stale_evidence_reopens() -> None:
    cfg = Config(quiet_period_s=600)
    r = run(takeover(), cfg, now=at(0))
    r.feed([commit("c", 17, "alpha", 6)], now=at(10))
    r.feed([verify("v", 7)], now=at(20))
    assert r.finding(W, 17).status.value == "open"
    assert r.advance(at(609)) == []
    assert r.finding(W, 17).status.value == "open"
    (up,) = r.advance(at(610))
    assert (up.finding.status.value, up.finding.revision) == ("resolved", 2)
    # alpha wakes up again: the episode reopens, severity kept, next revision
    (up,) = r.feed([ev("hb", "heartbeat", W, 17, "alpha", seq=8)], now=at(700)).updates[-1:]
    assert (up.finding.status.value, up.finding.severity.value) == ("open", "critical")
    assert up.finding.revision == 3
    assert r.advance(at(1299)) == []
    assert r.advance(at(1300))[0].finding.status.value == "resolved"


def test_quiet_period_without_verification_stays_open() -> None:
    r = run([*stale_commit()], Config(quiet_period_s=60), now=at(0))
    assert r.advance(at(10_000)) == []
    assert r.finding(W, 17).status.value == "open"


def test_reopening_after_fenced_resolution() -> None:
    r = run([*stale_commit(), ev("f", "lease_lost", W, 17, "alpha", seq=7), verify("v", 8)])
    assert r.finding(W, 17).status.value == "resolved"
    r.feed([ev("x", "effect_attempted", W, 17, "alpha", seq=9, key="next-key")])
    f = r.finding(W, 17)
    assert (f.status.value, f.severity.value, f.revision) == ("open", "critical", 3)
    assert ("stale_effect_attempt", 9, None) in conds(f)
