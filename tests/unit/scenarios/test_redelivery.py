"""Redelivery changes nothing; clean histories give nothing."""

from __future__ import annotations

from ..histories import K, W, acq, commit, cond_keys, conds, epochs, ev, run, takeover


def test_redelivered_event_id_changes_nothing() -> None:
    hist = [*takeover(), commit("c", 17, "alpha", 6), ev("hb", "heartbeat", W, 17, "alpha", seq=7)]
    r = run(hist)
    before = r.findings()
    n = len(r.updates)
    r.feed(hist[::-1])
    assert r.findings() == before
    assert len(r.updates) == n
    assert r.detector.counters.redelivered == len(hist)
    assert r.finding(W, 17).revision == 2


def test_clean_handoff_and_single_owner_give_nothing() -> None:
    r = run(
        [
            acq("a5", 5, "delta", 1, "report-index"),
            commit("c5", 5, "delta", 2, key="shard-01", wf="report-index"),
            ev("p5", "progress", "report-index", 5, "delta", seq=3),
            ev("l5", "lease_lost", "report-index", 5, "delta", seq=4),
            acq("a6", 6, "epsilon", 5, "report-index"),
            commit("c6", 6, "epsilon", 6, key="shard-02", wf="report-index"),
            acq("a3", 3, "zeta", 1, "checkout-sync"),
            *[ev(f"h{i}", "heartbeat", "checkout-sync", 3, "zeta", seq=i) for i in range(2, 12)],
            commit("z", 3, "zeta", 12, key="sync", wf="checkout-sync"),
            ev("zr", "lease_released", "checkout-sync", 3, "zeta", seq=13),
            # the same worker re-acquires under a new epoch: an acquisition count is not an error
            acq("a4", 4, "zeta", 14, "checkout-sync"),
            acq("a4b", 4, "zeta", 14, "checkout-sync"),
        ]
    )
    assert r.findings() == []
    assert r.updates == []
    assert r.detector.counters.findings_opened == 0


def test_three_epochs_each_displaced_owner_has_its_own_finding() -> None:
    r = run(
        [
            acq("a17", 17, "alpha", 1),
            acq("a18", 18, "beta", 2),
            acq("a19", 19, "gamma", 3),
            ev("p17", "progress", W, 17, "alpha", seq=4),
            commit("c18", 18, "beta", 5),
            commit("c19", 19, "gamma", 6),
        ]
    )
    f17, f18 = r.finding(W, 17), r.finding(W, 18)
    assert f17.finding_id != f18.finding_id
    assert epochs(f17) == (17, 19)
    assert f17.transition is not None and f17.transition.event_id == "a18"
    assert conds(f17) == [("stale_activity", 4, None)]
    assert f17.severity.value == "info"
    assert epochs(f18) == (18, 19)
    assert f18.transition is not None and f18.transition.event_id == "a19"
    assert conds(f18) == [("stale_effect_committed", 5, None), ("duplicate_effect", 6, "failover")]
    assert f18.conditions[-1].epochs == [18, 19]
    assert f18.severity.value == "critical"


def test_current_is_highest_epoch_acquired_before_latest_condition() -> None:
    r = run(
        [
            acq("a17", 17, "alpha", 1),
            acq("a18", 18, "beta", 2),
            ev("p", "progress", W, 17, "alpha", seq=3),
            acq("a19", 19, "gamma", 4),
        ]
    )
    assert epochs(r.finding(W, 17)) == (17, 18)
    r.feed([ev("x", "effect_attempted", W, 17, "alpha", seq=5, key=K)])
    assert epochs(r.finding(W, 17)) == (17, 19)


def test_interleaved_workflows_are_kept_apart() -> None:
    a, b, c = "tenant-1/a", "tenant-2/b", "tenant-3/c"
    r = run(
        [
            acq("a1", 1, "w1", 1, a),
            acq("b1", 1, "w1", 1, b),
            acq("c1", 7, "w9", 1, c),
            acq("a2", 2, "w2", 2, a),
            ev("bp", "progress", b, 1, "w1", seq=2),  # b: no takeover, not stale
            ev("ap", "progress", a, 1, "w1", seq=3),  # a: stale
            commit("bc", 1, "w1", 3, key=K, wf=b),
            acq("b2", 2, "w2", 4, b),
            commit("ac", 2, "w2", 4, key=K, wf=a),  # a: nothing committed under 1 for K
            commit("cc", 7, "w9", 2, key=K, wf=c),
            commit("bc2", 2, "w2", 5, key=K, wf=b),  # b: failover duplicate after clean handoff
            ev("bhb", "heartbeat", b, 1, "w1", seq=3),  # b: pre-takeover, buffered
        ]
    )
    assert {(f.workflow_key, *epochs(f)) for f in r.findings()} == {(a, 1, 2), (b, 1, 2)}
    assert conds(r.finding(a, 1)) == [("stale_activity", 3, None)]
    assert cond_keys(r.finding(b, 1)) == {("duplicate_effect", "failover", K)}
    assert r.findings(c) == []
