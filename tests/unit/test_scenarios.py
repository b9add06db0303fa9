"""Small histories written from DESIGN §4, each asserting what the on-call human would see."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.core import Config
from detector.events import parse_event_json
from tests.paths import SEED_FIXTURE

from .histories import at, cond_keys, conds, epochs, ev, evidence_cap, logfmt_events, run

SEED = SEED_FIXTURE
W = "export-ledger"
K = "release-index/2026-07-26"


def acq(event_id: str, epoch: int, worker: str, seq: int | None = None, wf: str = W, **kw):
    return ev(event_id, "lease_acquired", wf, epoch, worker, seq=seq, **kw)


def takeover(wf: str = W, seq: bool = True):
    """alpha holds 17 (seq 1), beta acquires 18 (seq 5)."""
    return [
        acq("a17", 17, "alpha", 1 if seq else None, wf),
        acq("a18", 18, "beta", 5 if seq else None, wf),
    ]


def commit(event_id, epoch, worker, seq, key=K, source="destination", wf=W, **kw):
    return ev(
        event_id, "effect_committed", wf, epoch, worker, seq=seq, key=key, source=source, **kw
    )


def verify(event_id, seq, key=K, wf=W, epoch=18):
    return ev(
        event_id, "outcome_verified", wf, epoch, "checker", seq=seq, key=key, source="verifier"
    )


# --- §6 acceptance history -------------------------------------------------------------------


def test_seed_fixture_one_critical_finding_and_two_clean_workflows():
    r = run([parse_event_json(line) for line in SEED.read_text().splitlines() if line.strip()])
    (f,) = r.findings()
    assert f.workflow_key == W
    assert (f.severity.value, f.status.value, f.revision) == ("critical", "open", 4)
    assert epochs(f) == (17, 18)
    assert (f.displaced.worker_id, f.current.worker_id) == ("worker-alpha", "worker-beta")
    assert (f.transition.event_id, f.transition.seq) == ("e05", 5)
    assert conds(f) == [
        ("stale_activity", 6, None),
        ("stale_effect_attempt", 7, None),
        ("stale_effect_committed", 8, None),
        ("duplicate_effect", 9, "failover"),
    ]
    dup = next(c for c in f.conditions if c.kind.value == "duplicate_effect")
    assert (dup.event_id, dup.effect_key, dup.epochs) == ("e09", K, [17, 18])
    assert (f.last_stale_event.event_id, f.last_stale_event.kind) == ("e08", "effect_committed")
    assert f.effect_keys == [K]
    assert (f.sink_outcome, f.ordering, f.confidence) == ("committed", "authoritative_seq", "high")
    # latest stale evidence (e08, seq 8, 10:00:24) after the takeover (e05, seq 5, 10:00:15)
    assert (f.evidence_lag.seq, f.evidence_lag.seconds) == (3, 9.0)
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


# --- each condition alone --------------------------------------------------------------------


def test_stale_progress_is_info_stale_activity():
    r = run([*takeover(), ev("p", "progress", W, 17, "alpha", seq=6, detail={"rows": 600})])
    f = r.finding(W, 17)
    assert (f.severity.value, f.status.value) == ("info", "open")
    assert epochs(f) == (17, 18)
    assert conds(f) == [("stale_activity", 6, None)]
    assert (f.sink_outcome, f.effect_keys) == ("none", [])
    # seq is authoritative, and a finding without effects needs nothing more (DESIGN §4)
    assert (f.ordering, f.confidence) == ("authoritative_seq", "high")
    assert "Stop or quarantine alpha" in f.response


def test_many_stale_heartbeats_give_one_condition_with_earliest_witness_and_latest_event():
    hbs = [ev(f"h{s}", "heartbeat", W, 17, "alpha", seq=s) for s in (9, 6, 7, 8)]
    r = run([*takeover(), *hbs])
    f = r.finding(W, 17)
    assert conds(f) == [("stale_activity", 6, None)]
    assert f.conditions[0].event_id == "h6"
    assert (f.last_stale_event.event_id, f.last_stale_event.kind) == ("h9", "heartbeat")
    assert f.severity.value == "info"
    assert f.evidence_lag.seq == 4


def test_destination_rejection_of_displaced_epoch_is_warning_with_high_confidence():
    r = run(
        [
            *takeover(),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=6, key=K, source="destination"),
        ]
    )
    f = r.finding(W, 17)
    assert f.severity.value == "warning"
    assert conds(f) == [("stale_effect_rejected", 6, None)]
    assert (f.sink_outcome, f.confidence, f.effect_keys) == ("rejected", "high", [K])
    assert "rejection receipt" in f.response


def test_stale_attempt_is_warning_attempted():
    r = run([*takeover(), ev("x", "effect_attempted", W, 17, "alpha", seq=6, key=K)])
    f = r.finding(W, 17)
    assert f.severity.value == "warning"
    assert conds(f) == [("stale_effect_attempt", 6, None)]
    assert f.conditions[0].effect_key == K
    assert f.sink_outcome == "attempted"
    assert "Freeze" in f.response


@pytest.mark.parametrize(("source", "confidence"), [("destination", "high"), ("worker", "medium")])
def test_stale_commit_is_critical_and_confidence_depends_on_who_confirms(source, confidence):
    r = run([*takeover(), commit("c", 17, "alpha", 6, source=source)])
    f = r.finding(W, 17)
    assert (f.severity.value, f.status.value) == ("critical", "open")
    assert conds(f) == [("stale_effect_committed", 6, None)]
    assert (f.sink_outcome, f.confidence) == ("committed", confidence)
    assert "compensation" in f.response


def test_worker_claim_then_destination_receipt_of_a_stale_commit_has_one_condition():
    r = run(
        [
            *takeover(),
            commit("claim", 17, "alpha", 6, source="worker"),
            commit("receipt", 17, "alpha", 7, source="destination"),
        ]
    )
    f = r.finding(W, 17)
    assert conds(f) == [("stale_effect_committed", 6, None)]
    assert r.findings(W) == [f]  # not a retry
    assert f.last_stale_event.event_id == "receipt"


def test_destination_receipt_gives_high_confidence_even_after_a_worker_claim():
    r = run(
        [
            *takeover(),
            commit("claim", 17, "alpha", 6, source="worker"),
            commit("receipt", 17, "alpha", 7, source="destination"),
        ]
    )
    assert r.finding(W, 17).confidence == "high"


def test_effect_rejected_without_key_takes_key_result():
    r = run([*takeover(), ev("rj", "effect_rejected", W, 17, "alpha", seq=6, source="destination")])
    f = r.finding(W, 17)
    assert f.conditions[0].effect_key == "result"
    assert f.effect_keys == ["result"]


# --- duplicates ------------------------------------------------------------------------------


def test_failover_duplicate_after_a_clean_handoff():
    # epoch 5 commits K and releases; epoch 6 takes over cleanly and commits K again.
    wf = "report-index"
    r = run(
        [
            acq("a5", 5, "delta", 1, wf),
            commit("c5", 5, "delta", 2, key="shard-01", wf=wf),
            ev("rel", "lease_released", wf, 5, "delta", seq=3),
            acq("a6", 6, "epsilon", 4, wf),
            commit("c6", 6, "epsilon", 5, key="shard-01", wf=wf),
        ]
    )
    f = r.finding(wf, 5)
    assert (f.severity.value, f.status.value) == ("critical", "open")
    assert epochs(f) == (5, 6)
    assert conds(f) == [("duplicate_effect", 5, "failover")]
    assert (f.conditions[0].event_id, f.conditions[0].epochs) == ("c6", [5, 6])
    assert f.last_stale_event is None
    assert f.effect_keys == ["shard-01"]
    assert "do not auto-retry" in f.response


def test_failover_duplicate_witness_is_later_commit_even_when_it_arrives_first():
    r = run([*takeover(), commit("c18", 18, "beta", 7), commit("c17", 17, "alpha", 3)])
    f = r.finding(W, 17)
    # c17 (seq 3) predates the takeover: not stale, but the effect happened twice
    assert conds(f) == [("duplicate_effect", 7, "failover")]
    assert f.conditions[0].event_id == "c18"
    assert f.severity.value == "critical"


def test_failover_epochs_do_not_depend_on_arrival_order():
    a17, a18, a19 = (
        acq("a17", 17, "alpha", 1),
        acq("a18", 18, "beta", 2),
        acq("a19", 19, "gamma", 4),
    )
    c18, c19 = commit("c18", 18, "beta", 3), commit("c19", 19, "gamma", 5)
    c17 = commit("c17", 17, "alpha", 6)  # alpha commits K after both beta and gamma did
    one = run([a17, a18, c18, a19, c19, c17]).finding(W, 17)
    other = run([a17, a18, a19, c19, c18, c17]).finding(W, 17)
    assert one.model_dump(exclude={"revision"}) == other.model_dump(exclude={"revision"})


def test_failover_confidence_does_not_depend_on_arrival_order():
    # alpha's commit of K is confirmed by the destination before the takeover; beta redoes K:
    # its worker logs the commit (seq 8) and the destination confirms it (seq 9).
    a17, c17 = acq("a17", 17, "alpha", 1), commit("c17", 17, "alpha", 4)
    a18 = acq("a18", 18, "beta", 5)
    claim, receipt = commit("claim", 18, "beta", 8, source="worker"), commit("rc", 18, "beta", 9)
    in_order = run([a17, c17, a18, claim, receipt]).finding(W, 17)
    receipt_first = run([a17, receipt, c17, a18, claim]).finding(W, 17)
    assert conds(in_order) == [("duplicate_effect", 8, "failover")]
    # every commit of K was confirmed by a destination, and seq orders the takeover
    assert (in_order.confidence, receipt_first.confidence) == ("high", "high")


def test_retry_duplicate_is_its_own_finding_without_displaced_owner():
    wf = "checkout-sync"
    r = run(
        [
            acq("a3", 3, "zeta", 1, wf),
            commit("c1", 3, "zeta", 2, key="reply-to/msg-8f2", wf=wf),
            commit("c2", 3, "zeta", 3, key="reply-to/msg-8f2", wf=wf),
        ]
    )
    (f,) = r.findings()
    assert f.displaced is None
    assert f.current.owner_epoch == 3
    assert (f.severity.value, f.status.value) == ("warning", "open")
    assert conds(f) == [("duplicate_effect", 3, "retry")]
    assert f.conditions[0].event_id == "c2"
    assert f.effect_keys == ["reply-to/msg-8f2"]
    assert "committed twice" in f.response


def test_worker_claim_plus_destination_confirmation_is_not_a_retry():
    r = run(
        [
            acq("a1", 1, "w", 1),
            commit("claim", 1, "w", 2, source="worker"),
            commit("conf", 1, "w", 3, source="destination"),
            commit("other", 1, "w", 4, key="other-key", source="destination"),
        ]
    )
    assert r.findings() == []
    assert r.updates == []


def test_stale_retry_gives_a_retry_finding_and_a_displaced_finding():
    r = run([*takeover(), commit("c1", 17, "alpha", 6), commit("c2", 17, "alpha", 7)])
    displaced = r.finding(W, 17)
    retry = r.finding(W, None)
    assert displaced.finding_id != retry.finding_id
    assert conds(displaced) == [("stale_effect_committed", 6, None)]
    assert conds(retry) == [("duplicate_effect", 7, "retry")]
    assert retry.severity.value == "warning"
    assert displaced.severity.value == "critical"


# --- order: seq, arrival, late buffers -------------------------------------------------------


def test_late_buffered_pre_takeover_evidence_raises_nothing():
    # alpha's checkpoint, attempt and commit all happened before the takeover (seq < 5) but were
    # buffered and only arrive after beta's acquisition.
    r = run(
        [
            *takeover(),
            ev("p", "progress", W, 17, "alpha", seq=2),
            ev("hb", "heartbeat", W, 17, "alpha", seq=3),
            ev("x", "effect_attempted", W, 17, "alpha", seq=3, key=K),
            commit("c", 17, "alpha", 4),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=4, key="other", source="destination"),
        ]
    )
    assert r.findings() == []
    assert r.updates == []


def test_arrival_order_fallback_without_seq_has_lower_confidence():
    r = run([*takeover(seq=False), ev("p", "progress", W, 17, "alpha")])
    f = r.finding(W, 17)
    # no effect condition: the order alone decides, and arrival is the weaker one
    assert (f.ordering, f.confidence) == ("arrival", "medium")
    assert conds(f) == [("stale_activity", None, None)]

    r = run([*takeover(seq=False), commit("c", 17, "alpha", None)])
    f = r.finding(W, 17)
    assert (f.ordering, f.confidence, f.severity.value) == ("arrival", "medium", "critical")


def test_arrival_order_when_only_one_side_has_seq():
    r = run([*takeover(), commit("c", 17, "alpha", None)])
    f = r.finding(W, 17)
    assert f.ordering == "arrival"
    assert f.confidence == "medium"


def test_arrival_order_event_before_acquisition_is_not_stale():
    r = run([acq("a17", 17, "alpha"), ev("p", "progress", W, 17, "alpha"), acq("a18", 18, "beta")])
    assert r.findings() == []


def test_acquisition_arriving_after_the_stale_events_it_displaces_still_finds_them():
    stale = [
        ev("p", "progress", W, 17, "alpha", seq=6),
        ev("x", "effect_attempted", W, 17, "alpha", seq=7, key=K),
        commit("c17", 17, "alpha", 8),
    ]
    late = run([acq("a17", 17, "alpha", 1), *stale, acq("a18", 18, "beta", 5)])
    in_order = run([*takeover(), *stale])
    f, g = late.finding(W, 17), in_order.finding(W, 17)
    assert conds(f) == [
        ("stale_activity", 6, None),
        ("stale_effect_attempt", 7, None),
        ("stale_effect_committed", 8, None),
    ]
    assert f.model_dump(exclude={"revision"}) == g.model_dump(exclude={"revision"})


# --- escalation and revisions ----------------------------------------------------------------


def test_escalation_publishes_one_revision_per_change_and_never_lowers_severity():
    r = run([*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=7)])
    r.feed([ev("x", "effect_attempted", W, 17, "alpha", seq=8, key=K)])
    r.feed([commit("c", 17, "alpha", 9)])
    # an earlier stale checkpoint arrives late: a new (earlier) witness, severity stays critical
    r.feed([ev("p", "progress", W, 17, "alpha", seq=6)])
    revs = r.revisions(r.finding(W, 17).finding_id)
    assert [(f.revision, f.severity.value) for f in revs] == [
        (1, "info"),
        (2, "warning"),
        (3, "critical"),
        (4, "critical"),
    ]
    assert revs[-1].conditions[0].event_id == "p"
    assert revs[-1].last_stale_event.event_id == "c"
    assert len({f.finding_id for f in revs}) == 1


def test_nothing_new_publishes_no_revision():
    r = run([*takeover(), commit("c", 17, "alpha", 8)])
    before = len(r.updates)
    # the current owner's routine work and a pre-takeover checkpoint change nothing
    r.feed(
        [
            ev("hb18", "heartbeat", W, 18, "beta", seq=9),
            ev("p18", "progress", W, 18, "beta", seq=10),
            ev("old", "progress", W, 17, "alpha", seq=2),
        ]
    )
    assert len(r.updates) == before
    assert r.finding(W, 17).revision == 1


# --- fence evidence is not a condition -------------------------------------------------------


@pytest.mark.parametrize("kind", ["lease_lost", "lease_released", "ownership_uncertain"])
def test_displaced_epoch_knowing_it_lost_is_not_a_condition(kind):
    r = run([*takeover(), ev("x", kind, W, 17, "alpha", seq=6)])
    assert r.findings() == []


def test_verifier_outcome_verified_from_displaced_epoch_is_never_stale():
    r = run([*takeover(), verify("v", 6, epoch=17)])
    assert r.findings() == []


# --- resolution ------------------------------------------------------------------------------


def _stale_commit():
    return [*takeover(), commit("c", 17, "alpha", 6)]


def test_fenced_alone_does_not_resolve():
    r = run([*_stale_commit(), ev("lost", "lease_lost", W, 17, "alpha", seq=7)])
    assert r.finding(W, 17).status.value == "open"


def test_verified_alone_does_not_resolve():
    r = run([*_stale_commit(), verify("v", 7)])
    assert r.finding(W, 17).status.value == "open"


@pytest.mark.parametrize("fence", ["lease_lost", "lease_released"])
def test_fenced_and_verified_resolves_keeping_severity(fence):
    r = run([*_stale_commit(), ev("f", fence, W, 17, "alpha", seq=7), verify("v", 8)])
    f = r.finding(W, 17)
    assert (f.status.value, f.severity.value, f.revision) == ("resolved", "critical", 2)


def test_stale_activity_only_resolves_on_fence_alone():
    r = run(
        [
            *takeover(),
            ev("hb", "heartbeat", W, 17, "alpha", seq=6),
            ev("f", "lease_lost", W, 17, "alpha", seq=7),
        ]
    )
    assert r.finding(W, 17).status.value == "resolved"


def test_resolution_evidence_must_come_after_the_stale_evidence():
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


def test_ownership_uncertain_is_not_fence_evidence_and_worker_verification_does_not_count():
    r = run(
        [
            *_stale_commit(),
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
            *_stale_commit(),
            ev("f", "lease_lost", W, 17, "alpha", seq=7),
            ev("wv", "outcome_verified", W, 18, "beta", seq=8, key=K, source="worker"),
        ]
    )
    assert r2.finding(W, 17).status.value == "open"


def test_every_effect_key_must_be_verified():
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


def test_verification_arriving_before_the_evidence_it_follows_still_resolves():
    r = run([verify("v", 8), ev("f", "lease_lost", W, 17, "alpha", seq=7), *_stale_commit()])
    assert r.finding(W, 17).status.value == "resolved"


def test_destination_rejection_after_a_stale_commit_fences():
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


def test_destination_rejection_of_the_only_attempt_fences():
    r = run(
        [
            *takeover(),
            ev("x", "effect_attempted", W, 17, "alpha", seq=6, key=K),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=7, key=K, source="destination"),
            verify("v", 8),
        ]
    )
    assert r.finding(W, 17).status.value == "resolved"


def test_rejection_fences_only_what_came_before_it():
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


def test_worker_reported_rejection_is_not_fence_evidence():
    r = run(
        [
            *_stale_commit(),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=7, key=K, source="worker"),
            ev("rj2", "effect_rejected", W, 17, "alpha", seq=8, key=K, source="worker"),
            verify("v", 9),
        ]
    )
    assert r.finding(W, 17).status.value == "open"


def test_failover_duplicate_after_clean_handoff_resolves_when_verified():
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


def test_retry_finding_resolves_when_verified():
    r = run([acq("a1", 1, "w", 1), commit("c1", 1, "w", 2), commit("c2", 1, "w", 3)])
    assert r.finding(W, None).status.value == "open"
    r.feed([verify("v", 4, epoch=1)])
    assert r.finding(W, None).status.value == "resolved"


def test_quiet_period_resolves_via_advance_and_new_stale_evidence_reopens():
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


def test_quiet_period_without_verification_stays_open():
    r = run([*_stale_commit()], Config(quiet_period_s=60), now=at(0))
    assert r.advance(at(10_000)) == []
    assert r.finding(W, 17).status.value == "open"


def test_reopening_after_fenced_resolution():
    r = run([*_stale_commit(), ev("f", "lease_lost", W, 17, "alpha", seq=7), verify("v", 8)])
    assert r.finding(W, 17).status.value == "resolved"
    r.feed([ev("x", "effect_attempted", W, 17, "alpha", seq=9, key="next-key")])
    f = r.finding(W, 17)
    assert (f.status.value, f.severity.value, f.revision) == ("open", "critical", 3)
    assert ("stale_effect_attempt", 9, None) in conds(f)


# --- redelivery, clean histories -------------------------------------------------------------


def test_redelivered_event_id_changes_nothing():
    hist = [*takeover(), commit("c", 17, "alpha", 6), ev("hb", "heartbeat", W, 17, "alpha", seq=7)]
    r = run(hist)
    before = r.findings()
    n = len(r.updates)
    r.feed(hist[::-1])
    assert r.findings() == before
    assert len(r.updates) == n
    assert r.detector.counters.redelivered == len(hist)
    assert r.finding(W, 17).revision == 2


def test_clean_handoff_and_single_owner_give_nothing():
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


def test_three_epochs_each_displaced_owner_has_its_own_finding():
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
    assert f17.transition.event_id == "a18"
    assert conds(f17) == [("stale_activity", 4, None)]
    assert f17.severity.value == "info"
    assert epochs(f18) == (18, 19)
    assert f18.transition.event_id == "a19"
    assert conds(f18) == [("stale_effect_committed", 5, None), ("duplicate_effect", 6, "failover")]
    assert f18.conditions[-1].epochs == [18, 19]
    assert f18.severity.value == "critical"


def test_current_is_highest_epoch_acquired_before_latest_condition():
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


def test_interleaved_workflows_are_kept_apart():
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


# --- lease health ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease", "hb", "warned"), [(60, 30, True), (65, 30, True), (65.5, 30, False), (90, 30, False)]
)
def test_lease_policy_warning_when_lease_not_longer_than_two_heartbeats_plus_jitter(
    lease, hb, warned
):
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


def test_heartbeat_gap_close_to_lease_expiry_warns_per_tool_class():
    common = {"attrs": {"tool_class": "export"}}
    r = run(
        [
            acq("a", 1, "w", 1, t=0, lease_duration_s=90, heartbeat_interval_s=30, **common),
            ev("h1", "heartbeat", W, 1, "w", seq=2, t=30),
            ev("h2", "heartbeat", W, 1, "w", seq=3, t=60),
            ev("h3", "heartbeat", W, 1, "w", seq=4, t=140),  # gap 80 s: 5 s jitter short of 90
        ]
    )
    assert r.detector.lease_health.warnings == []
    r.feed([ev("h4", "heartbeat", W, 1, "w", seq=5, t=225)])  # gap 85 s: within the reserve
    (w,) = r.detector.lease_health.warnings
    assert (w.tool_class, w.reason, w.observed_gap_s) == ("export", "heartbeat_gap", 85.0)
    # a second gap of the same class does not repeat the warning
    r.feed([ev("h5", "heartbeat", W, 1, "w", seq=6, t=320)])
    assert len(r.detector.lease_health.warnings) == 1
    assert r.detector.lease_health.classes["export"].near_expiry == 2  # each gap is counted


def test_displaced_heartbeats_do_not_count_as_gaps_of_the_current_owner():
    lease = {"lease_duration_s": 90, "heartbeat_interval_s": 30, "attrs": {"tool_class": "x"}}
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


# --- eviction and caps -----------------------------------------------------------------------


def test_eviction_after_release_and_quiet_period():
    cfg = Config(quiet_period_s=600)
    r = run([acq("a1", 1, "w", 1), ev("rel", "lease_released", W, 1, "w", seq=2)], cfg, at(0))
    r.advance(at(599))
    assert W in r.detector.states
    r.advance(at(600))
    assert W not in r.detector.states
    assert (r.detector.counters.evicted_released, r.detector.counters.evicted_idle) == (1, 0)


def test_release_does_not_evict_an_open_finding():
    cfg = Config(quiet_period_s=600, idle_ttl_s=10**9)
    r = run([*_stale_commit(), ev("rel", "lease_released", W, 18, "beta", seq=9)], cfg, at(0))
    r.advance(at(5000))
    assert r.finding(W, 17).status.value == "open"
    assert r.detector.counters.evicted_released == 0


def test_released_workflow_with_a_finding_keeps_its_revisions_going():
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


def test_idle_eviction_never_republishes_a_finding_revision():
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
    latest: dict[str, object] = {}
    for u in r.updates:  # a reader keeping the highest revision per finding_id
        old = latest.get(u.finding.finding_id)
        if old is None or u.finding.revision > old.revision:
            latest[u.finding.finding_id] = u.finding
    assert any(f.severity.value == "critical" for f in latest.values())


def test_compaction_keeps_the_displaced_owner_of_a_finding():
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
    assert r.finding(W, 0).displaced.worker_id == "alpha"
    r.advance(at(600))  # released and quiet: compacted
    r.feed([acq("a1", 1, "beta", 8)], now=at(700))  # a late acquisition forces a re-render
    assert all(u.finding.displaced is not None for u in r.updates)
    assert all(u.finding.displaced.worker_id == "alpha" for u in r.updates)


def test_idle_workflow_is_evicted_after_ttl():
    cfg = Config(idle_ttl_s=3600, idle_sweep_s=0)
    r = run([acq("a1", 1, "w", 1, t=0)], cfg)
    r.feed([acq("b1", 1, "w", 1, wf="other", t=1000)])
    r.advance(at(3599))
    assert set(r.detector.states) == {W, "other"}
    r.advance(at(3600))
    assert set(r.detector.states) == {"other"}
    assert (r.detector.counters.evicted_idle, r.detector.counters.evicted_released) == (1, 0)
    assert r.detector.changed == {W}  # for the worker to write the tombstone


def test_idle_workflows_are_found_by_a_sweep_every_idle_sweep_s():
    r = run([acq("a1", 1, "w", 1, t=0)], Config(idle_ttl_s=3600, idle_sweep_s=600))
    r.advance(at(3599))  # the first advance sweeps: not idle yet
    r.advance(at(3600))  # idle now, but no sweep is due
    r.advance(at(4198))
    assert set(r.detector.states) == {W}
    r.advance(at(4199))  # 600 s after the last sweep
    assert set(r.detector.states) == set()


def test_between_sweeps_advance_still_resolves_and_evicts_what_it_watches():
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
    assert {W, "done"} <= r.detector.changed


def test_activity_evidence_cap_is_counted_and_redelivery_window_is_bounded():
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


def test_raw_effects_over_the_evidence_cap_are_counted_and_keys_are_kept():
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


def test_effect_keys_over_their_cap_truncate_the_workflow():
    r = run([acq("a1", 1, "w", 1)], Config(max_effect_keys=4))
    r.feed([commit(f"c{i}", 1, "w", i + 2, key=f"k{i}") for i in range(6)])
    assert r.detector.counters.effects_dropped == 2  # the oldest of five, then of five again
    assert r.detector.counters.workflows_truncated == 1
    assert r.detector.truncated_workflows() == [W]
    r.feed([acq("a2", 2, "v", 20), commit("again", 2, "v", 21, key="k5")])
    (f,) = r.findings()
    assert f.evidence_truncated and f.confidence != "high"


def test_acquisitions_over_their_cap_are_counted():
    cfg = Config(max_acquisitions=3)
    r = run([acq(f"a{i}", i, f"w{i}", i) for i in range(1, 6)], cfg)
    assert len(r.detector.states[W].acqs) == 3
    assert r.detector.counters.acquisitions_dropped == 2


def test_counters_count_events_findings_and_revisions():
    r = run([*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=6), commit("c", 17, "a", 7)])
    c = r.detector.counters
    assert (c.events, c.findings_opened, c.revisions) == (4, 1, 2)
    assert c.revisions == len(r.updates)


# --- state round trip ------------------------------------------------------------------------


def test_state_survives_encode_decode_mid_episode():
    from detector.core import decode_state, encode_state  # noqa: PLC0415

    first = [*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=6)]
    rest = [
        commit("c", 17, "alpha", 7),
        ev("f", "lease_lost", W, 17, "alpha", seq=8),
        verify("v", 9),
    ]
    straight = run([*first, *rest])
    r = run(first)
    r.detector.states = {k: decode_state(encode_state(s)) for k, s in r.detector.states.items()}
    r.feed(rest)
    assert r.findings() == straight.findings()
    assert r.finding(W, 17).status.value == "resolved"


def test_open_findings_are_counted_by_severity_and_found_again_after_a_restore():
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415
    from detector.findings import Severity  # noqa: PLC0415

    first = [*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=6)]
    r = run([*first, commit("c", 17, "alpha", 7)])
    assert r.detector.open_findings()[Severity.CRITICAL] == 1
    assert sum(r.detector.open_findings().values()) == 1
    # A restored worker has a fresh detector: its first pass of time finds the open finding.
    restored = Detector(
        states={k: decode_state(encode_state(v)) for k, v in r.detector.states.items()}
    )
    restored.advance(at(40))
    assert restored.open_findings()[Severity.CRITICAL] == 1
    # Fenced and verified: resolved, no longer counted.
    r.feed([ev("f", "lease_lost", W, 17, "alpha", seq=8), verify("v", 9)])
    assert r.finding(W, 17).status.value == "resolved"
    assert sum(r.detector.open_findings().values()) == 0


def test_state_survives_encode_decode_at_every_length_of_retained_evidence():
    """Short evidence is held as a tuple, long as a list: both come back as they were."""
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    d = Detector(Config(max_evidence=12))
    d.observe(acq("a", 17, "alpha", 1))
    for seq in range(2, 40):
        d.observe(ev(f"hb{seq}", "heartbeat", W, 17, "alpha", seq=seq))
        state = d.states[W]
        assert decode_state(encode_state(state)) == state
        assert 0 < len(state.evidence) <= 12


@pytest.mark.parametrize("name", ["state-v1-export-ledger.json", "state-v2-export-ledger.msgpack"])
def test_state_written_by_earlier_versions_still_decodes(name: str):
    """Changelogs written by versions 1 (JSON) and 2 (the records only) restore by replay: the
    same finding, and the next event continues it at its next revision, never republishing one."""
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    r = run([parse_event_json(line) for line in SEED.read_text().splitlines() if line.strip()])
    raw = (Path(__file__).parent / "data" / name).read_bytes()
    restored = Detector(states={W: decode_state(raw.strip() if raw[:1] == b"{" else raw)})
    assert restored.findings() == r.findings(W)
    assert decode_state(encode_state(r.detector.states[W])) == r.detector.states[W]
    later = ev("e99", "heartbeat", W, 17, "worker-alpha", seq=99)
    (up,) = restored.observe(later)
    assert (up.finding.revision, up.finding.last_stale_event.event_id) == (5, "e99")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b'{"v":7,"pos":1}', "unknown workflow state version 7"),
        (b"\x93\x07\x01\x02", "unknown workflow state version 7"),  # msgpack [7, 1, 2]
        (b"\x91\x02", "damaged workflow state: 1 fields"),  # msgpack [2]
    ],
)
def test_a_state_of_an_unknown_version_or_damaged_is_refused(raw: bytes, problem: str):
    from detector.core import decode_state  # noqa: PLC0415

    with pytest.raises(ValueError, match=problem):
        decode_state(raw)


# --- job-queue logfmt logs -------------------------------------------------------------------


def test_job_queue_log_with_rejected_result():
    pytest.importorskip("detector.logfmt")
    events = logfmt_events(
        """
        job_claimed job=8f1b token=41 worker=w1 seq=1 event_id=l1
        heartbeat_ok job=8f1b token=41 worker=w1 seq=2 event_id=l2
        job_claimed job=8f1b token=42 worker=w2 seq=3 event_id=l3
        heartbeat_ok job=8f1b fencing_token=41 owner_id=w1 seq=4 event_id=l4
        tool_request_started job=8f1b token=41 worker=w1 seq=5 event_id=l5 effect_key=upload/8f1b
        result_rejected job=8f1b token=41 worker=w1 seq=6 event_id=l6 source=destination
        heartbeat_lost job=8f1b token=41 worker=w1 seq=7 event_id=l7
        """
    )
    r = run(events)
    f = r.finding("8f1b", 41)
    assert epochs(f) == (41, 42)
    assert (f.displaced.worker_id, f.current.worker_id) == ("w1", "w2")
    assert conds(f) == [
        ("stale_activity", 4, None),
        ("stale_effect_attempt", 5, None),
        ("stale_effect_rejected", 6, None),
    ]
    assert sorted(f.effect_keys) == ["result", "upload/8f1b"]
    assert f.severity.value == "warning"
    # the attempted upload was never rejected: the sink may have taken it
    assert f.sink_outcome == "attempted"
    # heartbeat_lost is not a condition; fenced, but neither key is verified
    assert f.status.value == "open"


def test_job_queue_log_clean_handoff_and_buffered_line():
    pytest.importorskip("detector.logfmt")
    events = logfmt_events(
        """
        job_claimed job=q7 token=1 worker=w1 seq=1
        heartbeat_ok job=q7 token=1 worker=w1 seq=2
        heartbeat_lost job=q7 token=1 worker=w1 seq=3
        job_claimed job=q7 token=2 worker=w2 seq=5
        heartbeat_ok job=q7 token=2 worker=w2 seq=6
        heartbeat_ok job=q7 token=1 worker=w1 seq=4
        """
    )
    assert [e.kind.value for e in events[:3]] == ["lease_acquired", "heartbeat", "lease_lost"]
    r = run(events)
    assert r.findings() == []


def test_job_queue_log_stale_worker_after_takeover():
    pytest.importorskip("detector.logfmt")
    events = logfmt_events(
        """
        job_claimed job=q9 token=7 worker=w1 seq=1 attrs.tool_class=llm
        job_claimed job=q9 token=8 worker=w2 seq=2 attrs.tool_class=llm
        heartbeat_ok job=q9 token=7 worker=w1 seq=3
        tool_request_started job=q9 token=7 worker=w1 seq=4 effect_key=reply/123
        """
    )
    f = run(events).finding("q9", 7)
    assert f.severity.value == "warning"
    assert conds(f) == [("stale_activity", 3, None), ("stale_effect_attempt", 4, None)]
