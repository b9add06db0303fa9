"""Eviction after release or idleness, and the evidence caps."""

from __future__ import annotations

from detector.contracts.findings import Finding
from detector.core import Config

from ..histories import (
    Run,
    W,
    acq,
    at,
    commit,
    cond_keys,
    ev,
    evidence_cap,
    run,
    stale_commit,
    takeover,
    verify,
)


def test_eviction_after_release_and_quiet_period() -> None:
    cfg = Config(quiet_period_s=600)
    r = run([acq("a1", 1, "w", 1), ev("rel", "lease_released", W, 1, "w", seq=2)], cfg, at(0))
    r.advance(at(599))
    assert W in r.detector.states
    r.advance(at(600))
    assert W not in r.detector.states
    assert (r.detector.counters.evicted_released, r.detector.counters.evicted_idle) == (1, 0)


def test_release_does_not_evict_an_open_finding() -> None:
    cfg = Config(quiet_period_s=600, idle_ttl_s=10**9)
    r = run([*stale_commit(), ev("rel", "lease_released", W, 18, "beta", seq=9)], cfg, at(0))
    r.advance(at(5000))
    assert r.finding(W, 17).status.value == "open"
    assert r.detector.counters.evicted_released == 0


def test_released_workflow_with_a_finding_keeps_its_revisions_going() -> None:
    # beta finishes the workflow, but alpha's episode is on record: when alpha acts again under
    # a later owner, the same finding continues at the next revision (never revision 1 again)
    cfg = Config(quiet_period_s=600)
    r = run(
        [
            *takeover(),
            ev("p", "progress", W, 17, "alpha", seq=6),
            ev("l", "lease_lost", W, 17, "alpha", seq=7),
            ev("rel", "lease_released", W, 18, "beta", seq=8),
        ],
        cfg,
        at(0),
    )
    r.advance(at(5000))
    r.feed([acq("a19", 19, "gamma", 9), commit("c", 17, "alpha", 10)], now=at(5100))
    assert [(u.finding.revision, u.finding.status.value) for u in r.updates] == [
        (1, "open"),
        (2, "resolved"),
        (3, "open"),
    ]
    assert len({u.finding.finding_id for u in r.updates}) == 1
    assert r.updates[-1].finding.severity.value == "critical"


def test_idle_eviction_never_republishes_a_finding_revision() -> None:
    r = run(
        [*takeover(), ev("p", "progress", W, 17, "alpha", seq=6)],
        Config(idle_ttl_s=3600, quiet_period_s=600),
        at(0),
    )
    r.advance(at(3600))  # resolved by the quiet period, then evicted as idle
    assert r.detector.counters.evicted_idle == 1
    r.feed([acq("a19", 19, "gamma", 9), commit("c", 17, "alpha", 10)], now=at(3700))
    pairs = [(u.finding.finding_id, u.finding.revision) for u in r.updates]
    assert len(pairs) == len(set(pairs))
    latest: dict[str, Finding] = {}
    for u in r.updates:  # a reader keeping the highest revision per finding_id
        old = latest.get(u.finding.finding_id)
        if old is None or u.finding.revision > old.revision:
            latest[u.finding.finding_id] = u.finding
    assert any(f.severity.value == "critical" for f in latest.values())


def test_compaction_keeps_the_displaced_owner_of_a_finding() -> None:
    # the detector never saw epoch 0's acquisition (older than its retention); alpha (epoch 0)
    # heartbeats after gamma's takeover, then learns it lost; gamma finishes the workflow
    r = run(
        [
            acq("a2", 2, "gamma", 15),
            ev("h16", "heartbeat", W, 0, "alpha", seq=16),
            ev("l", "lease_lost", W, 0, "alpha", seq=17),
            ev("rel", "lease_released", W, 2, "gamma", seq=19),
        ],
        Config(quiet_period_s=600),
        at(0),
    )
    finding = r.finding(W, 0)
    assert finding.displaced is not None and finding.displaced.worker_id == "alpha"
    r.advance(at(600))  # released and quiet: compacted
    compacted = len(r.updates)
    r.feed([acq("a1", 1, "beta", 8)], now=at(700))  # a late acquisition forces a re-render
    rerendered = r.updates[compacted:]
    assert [(u.finding.finding_id, u.finding.revision) for u in rerendered] == [
        (finding.finding_id, 3)
    ]
    assert rerendered[0].finding.displaced == finding.displaced


def test_idle_workflow_is_evicted_after_ttl() -> None:
    cfg = Config(idle_ttl_s=3600, idle_sweep_s=0)
    r = run([acq("a1", 1, "w", 1, t=0)], cfg)
    r.feed([acq("b1", 1, "w", 1, wf="other", t=1000)])
    r.advance(at(3599))
    assert set(r.detector.states) == {W, "other"}
    r.advance(at(3600))
    assert set(r.detector.states) == {"other"}
    assert (r.detector.counters.evicted_idle, r.detector.counters.evicted_released) == (1, 0)
    assert r.changed == {W}  # for the worker to write the tombstone


def test_idle_workflows_are_found_by_a_sweep_every_idle_sweep_s() -> None:
    r = run([acq("a1", 1, "w", 1, t=0)], Config(idle_ttl_s=3600, idle_sweep_s=600))
    r.advance(at(3599))  # the first advance sweeps: not idle yet
    r.advance(at(3600))  # idle now, but no sweep is due
    r.advance(at(4198))
    assert set(r.detector.states) == {W}
    r.advance(at(4199))  # 600 s after the last sweep
    assert set(r.detector.states) == set()


def test_between_sweeps_advance_still_resolves_and_evicts_what_it_watches() -> None:
    # An open finding resolved by the quiet period, and a released workflow evicted after it,
    # both between sweeps (the sweep interval is longer than the whole test).
    cfg = Config(quiet_period_s=600, idle_sweep_s=10**9)
    r = run([*takeover(), ev("p", "progress", W, 17, "alpha", seq=6)], cfg, at(0))
    r.feed([ev("c1", "lease_acquired", "done", 1, "w", seq=1, source="coordinator")], now=at(1))
    r.feed([ev("c2", "lease_released", "done", 1, "w", seq=2)], now=at(2))
    r.advance(at(5))  # the first advance: a sweep
    (resolved,) = r.advance(at(610))
    assert resolved.finding.status.value == "resolved"
    assert "done" not in r.detector.states
    assert r.detector.counters.evicted_released == 1
    assert {W, "done"} <= r.changed


def test_activity_evidence_cap_is_counted_and_redelivery_window_is_bounded() -> None:
    cfg = evidence_cap(8)
    hbs = [ev(f"h{i}", "heartbeat", W, 1, "w", seq=i + 2) for i in range(10)]
    r = run([acq("a1", 1, "w", 1), *hbs], cfg)
    retained = len(r.detector.states[W].evidence)
    assert retained <= 8
    counters = r.detector.counters
    assert counters.activity_dropped == 10 - retained  # every forgotten one counted
    assert counters.effects_dropped == counters.acquisitions_dropped == 0
    r.feed([hbs[-1]])  # still retained: a redelivery
    assert r.detector.counters.redelivered == 1


def test_raw_effects_over_the_evidence_cap_are_counted_and_keys_are_kept() -> None:
    r = run([acq("a1", 1, "w", 1)], evidence_cap(4))
    r.feed([commit(f"c{i}", 1, "w", i + 2, key=f"k{i}") for i in range(6)])
    c = r.detector.counters
    assert (c.events_dropped, c.activity_dropped, c.effects_dropped) == (2, 0, 0)
    assert r.findings() == []
    # a second commit of the first key, under a new owner: the raw commit is gone, its key not
    r.feed([acq("a2", 2, "v", 20), commit("again", 2, "v", 21, key="k0")])
    (f,) = r.findings()
    assert ("duplicate_effect", "failover", "k0") in cond_keys(f)
    assert not f.evidence_truncated


def test_effect_keys_over_their_cap_truncate_the_workflow() -> None:
    r = run([acq("a1", 1, "w", 1)], Config(max_effect_keys=4))
    r.feed([commit(f"c{i}", 1, "w", i + 2, key=f"k{i}") for i in range(6)])
    assert r.detector.counters.effects_dropped == 2  # the oldest of five, then of five again
    assert r.detector.counters.workflows_truncated == 1
    assert r.detector.truncated_workflows() == [W]
    r.feed([acq("a2", 2, "v", 20), commit("again", 2, "v", 21, key="k5")])
    (f,) = r.findings()
    assert f.evidence_truncated and f.confidence != "high"


def test_acquisitions_over_their_cap_are_counted() -> None:
    cfg = Config(max_acquisitions=3)
    r = run([acq(f"a{i}", i, f"w{i}", i) for i in range(1, 6)], cfg)
    assert len(r.detector.states[W].acqs) == 3
    assert r.detector.counters.acquisitions_dropped == 2


def test_counters_count_events_findings_and_revisions() -> None:
    r = run([*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=6), commit("c", 17, "a", 7)])
    c = r.detector.counters
    assert (c.events, c.findings_opened, c.revisions) == (4, 1, 2)
    assert c.revisions == len(r.updates)


def test_a_forgotten_finding_goes_on_at_its_next_revision_under_its_id() -> None:
    """A workflow whose finding resolved is forgotten once idle, down to a few dozen bytes; new
    stale evidence then continues the same finding at its next revision, also after a restore."""
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    cfg = Config(idle_ttl_s=3600, quiet_period_s=600)
    r = run(
        [
            *takeover(),
            ev("p", "progress", W, 17, "alpha", seq=6),
            ev("l", "lease_lost", W, 17, "alpha", seq=7),
        ],
        cfg,
        at(0),
    )
    before = r.finding(W, 17)
    assert before.status.value == "resolved"
    r.advance(at(3600))
    assert r.detector.counters.evicted_idle == 1 and W in r.changed
    kept = r.detector.states[W]
    assert (kept.acqs, kept.evidence, kept.found, kept.effects) == ((), (), None, None)
    raw = encode_state(kept)
    assert len(raw) <= 64, raw
    restarted = Run(Detector(cfg, states={W: decode_state(raw)}))
    for engine in (r, restarted):
        engine.feed([acq("a19", 19, "gamma", 9), commit("c", 17, "alpha", 10)], now=at(3700))
        (update,) = [u for u in engine.updates if u.finding.revision > before.revision]
        assert update.finding.finding_id == before.finding_id
        assert update.finding.revision == before.revision + 1
        assert (update.finding.status.value, update.finding.severity.value) == (
            "open",
            "critical",
        )
        assert update.finding.evidence_truncated  # what came before was forgotten


def test_a_finding_waiting_for_its_verifier_is_never_forgotten_and_is_once_verified() -> None:
    """A stale commit's finding stays open, its whole state kept, until a verifier confirms the
    key (DESIGN §4), however long its workflow is idle; once verified and quiet, it resolves and
    its workflow is forgotten down to its remnant at the next idle sweep."""
    cfg = Config(idle_ttl_s=3600, quiet_period_s=600)
    r = run(stale_commit(), cfg, at(0))
    r.advance(at(10 * 3600))
    assert r.finding(W, 17).status.value == "open"
    held = r.detector.states[W]  # compacted (raw events gone), not forgotten
    assert held.found and held.effects and held.acqs and held.past is None
    r.feed([verify("v", 7)], now=at(10 * 3600 + 1))
    r.advance(at(11 * 3600 + 2))
    last = r.updates[-1].finding
    assert (last.finding_id, last.status.value) == (r.updates[0].finding.finding_id, "resolved")
    kept = r.detector.states[W]
    assert (kept.acqs, kept.evidence, kept.found, kept.effects) == ((), (), None, None)
    assert kept.past is not None and kept.past[0][2] == last.revision


def test_an_expired_remnant_is_removed_and_a_later_finding_starts_afresh() -> None:
    """A remnant goes `remnant_ttl_s` after it was made (no reader can see its findings'
    revisions any more). A later event of its workflow finds nothing: it is not stale until an
    acquisition seen since displaces it, and the finding that forms again for the same displaced
    epoch has the same id and starts at revision 1 (README "Forgotten workflows")."""
    cfg = Config(idle_ttl_s=3600, quiet_period_s=600, remnant_ttl_s=7200, idle_sweep_s=0)
    r = run(
        [
            *takeover(),
            ev("p", "progress", W, 17, "alpha", seq=6),
            ev("l", "lease_lost", W, 17, "alpha", seq=7),
        ],
        cfg,
        at(0),
    )
    before = r.finding(W, 17)
    assert (before.status.value, before.revision) == ("resolved", 2)
    r.advance(at(3600))
    assert r.detector.states[W].last_at == at(3600)  # a remnant, made now
    r.advance(at(3600 + 7199))
    assert W in r.detector.states
    r.changed.clear()
    r.advance(at(3600 + 7200))
    assert W not in r.detector.states and W in r.changed  # a tombstone on the changelog
    assert r.detector.counters.evicted_expired == 1
    published = len(r.updates)
    r.feed([commit("late", 17, "alpha", 10, key="other")], now=at(20000))
    assert len(r.updates) == published  # nothing displaced epoch 17 as far as it knows now
    r.feed([acq("a19", 19, "gamma", 11), commit("c", 17, "alpha", 12)], now=at(20001))
    (again,) = r.updates[published:]
    assert again.finding.finding_id == before.finding_id
    assert (again.finding.revision, again.finding.status.value) == (1, "open")
    assert not again.finding.evidence_truncated  # nothing of this history was forgotten
