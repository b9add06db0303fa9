"""The DESIGN §6 acceptance history, as the on-call human sees it."""

from __future__ import annotations

from ..histories import K, W, conds, epochs, run, seed_history


def test_seed_fixture_one_critical_finding_and_two_clean_workflows() -> None:
    r = run(seed_history())
    (f,) = r.findings()
    assert f.workflow_key == W
    assert (f.severity.value, f.status.value, f.revision) == ("critical", "open", 4)
    assert epochs(f) == (17, 18)
    assert f.displaced is not None and f.current is not None
    assert (f.displaced.worker_id, f.current.worker_id) == ("worker-alpha", "worker-beta")
    assert f.transition is not None and (f.transition.event_id, f.transition.seq) == ("e05", 5)
    assert conds(f) == [
        ("stale_activity", 6, None),
        ("stale_effect_attempt", 7, None),
        ("stale_effect_committed", 8, None),
        ("duplicate_effect", 9, "failover"),
    ]
    dup = next(c for c in f.conditions if c.kind.value == "duplicate_effect")
    assert (dup.event_id, dup.effect_key, dup.epochs) == ("e09", K, [17, 18])
    stale = f.last_stale_event
    assert stale is not None and (stale.event_id, stale.kind) == ("e08", "effect_committed")
    assert f.effect_keys == [K]
    assert (f.sink_outcome, f.ordering, f.confidence) == ("committed", "authoritative_seq", "high")
    # latest stale evidence (e08, seq 8, 10:00:24) after the takeover (e05, seq 5, 10:00:15)
    assert f.evidence_lag is not None and (f.evidence_lag.seq, f.evidence_lag.seconds) == (3, 9.0)
    # guidance for the highest condition: the duplicate across owners
    assert "do not auto-retry worker-beta" in f.response
    assert r.detector.counters.findings_opened == 1
    # Opened at info, then raised twice: what pages is the revision that reaches critical.
    assert [(u.finding.severity.value, u.escalated) for u in r.updates] == [
        ("info", True),
        ("warning", True),
        ("critical", True),
        ("critical", False),
    ]


def test_seed_fixture_draws_no_lease_warning() -> None:
    """Its leases are the practice's own example, 90 s with a 30 s heartbeat: healthy under
    DESIGN §4's defaults (R = 1, J = 20 s, T = H: 30 + 30 + 20 = 80 < 90)."""
    r = run(seed_history())
    assert r.detector.lease_health.warnings == []
