"""Each condition alone, and the fence evidence that is not a condition."""

from __future__ import annotations

import pytest

from ..histories import K, W, commit, conds, epochs, ev, run, takeover, verify

# --- each condition alone --------------------------------------------------------------------


def test_stale_progress_is_info_stale_activity() -> None:
    r = run([*takeover(), ev("p", "progress", W, 17, "alpha", seq=6, detail={"rows": 600})])
    f = r.finding(W, 17)
    assert (f.severity.value, f.status.value) == ("info", "open")
    assert epochs(f) == (17, 18)
    assert conds(f) == [("stale_activity", 6, None)]
    assert (f.sink_outcome, f.effect_keys) == ("none", [])
    # seq is authoritative, and a finding without effects needs nothing more (DESIGN §4)
    assert (f.ordering, f.confidence) == ("authoritative_seq", "high")
    assert "Stop or quarantine alpha" in f.response


def test_many_stale_heartbeats_give_one_condition_with_earliest_witness_and_latest_event() -> None:
    hbs = [ev(f"h{s}", "heartbeat", W, 17, "alpha", seq=s) for s in (9, 6, 7, 8)]
    r = run([*takeover(), *hbs])
    f = r.finding(W, 17)
    assert conds(f) == [("stale_activity", 6, None)]
    assert f.conditions[0].event_id == "h6"
    stale = f.last_stale_event
    assert stale is not None and (stale.event_id, stale.kind) == ("h9", "heartbeat")
    assert f.severity.value == "info"
    assert f.evidence_lag is not None and f.evidence_lag.seq == 4


def test_destination_rejection_of_displaced_epoch_is_warning_with_high_confidence() -> None:
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


def test_stale_attempt_is_warning_attempted() -> None:
    r = run([*takeover(), ev("x", "effect_attempted", W, 17, "alpha", seq=6, key=K)])
    f = r.finding(W, 17)
    assert f.severity.value == "warning"
    assert conds(f) == [("stale_effect_attempt", 6, None)]
    assert f.conditions[0].effect_key == K
    assert f.sink_outcome == "attempted"
    assert "Freeze" in f.response


@pytest.mark.parametrize(("source", "confidence"), [("destination", "high"), ("worker", "medium")])
def test_stale_commit_is_critical_and_confidence_depends_on_who_confirms(
    source: str, confidence: str
) -> None:
    r = run([*takeover(), commit("c", 17, "alpha", 6, source=source)])
    f = r.finding(W, 17)
    assert (f.severity.value, f.status.value) == ("critical", "open")
    assert conds(f) == [("stale_effect_committed", 6, None)]
    assert (f.sink_outcome, f.confidence) == ("committed", confidence)
    assert "compensation" in f.response


def test_worker_claim_then_destination_receipt_of_a_stale_commit_has_one_condition() -> None:
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
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "receipt"


def test_destination_receipt_gives_high_confidence_even_after_a_worker_claim() -> None:
    r = run(
        [
            *takeover(),
            commit("claim", 17, "alpha", 6, source="worker"),
            commit("receipt", 17, "alpha", 7, source="destination"),
        ]
    )
    assert r.finding(W, 17).confidence == "high"


def test_effect_rejected_without_key_takes_key_result() -> None:
    r = run([*takeover(), ev("rj", "effect_rejected", W, 17, "alpha", seq=6, source="destination")])
    f = r.finding(W, 17)
    assert f.conditions[0].effect_key == "result"
    assert f.effect_keys == ["result"]


# --- fence evidence is not a condition -------------------------------------------------------


@pytest.mark.parametrize("kind", ["lease_lost", "lease_released", "ownership_uncertain"])
def test_displaced_epoch_knowing_it_lost_is_not_a_condition(kind: str) -> None:
    r = run([*takeover(), ev("x", kind, W, 17, "alpha", seq=6)])
    assert r.findings() == []


def test_verifier_outcome_verified_from_displaced_epoch_is_never_stale() -> None:
    r = run([*takeover(), verify("v", 6, epoch=17)])
    assert r.findings() == []


# --- many keys: the highest condition's keys are listed and named first -------------------------


@pytest.mark.parametrize("committed", ["a-first", "z-last", "k13"])
def test_a_commit_among_many_attempted_keys_is_listed_and_named_first(committed: str) -> None:
    """25 attempted keys, then one more key committed, sorting before, after or among them: the
    commit is critical, its key is listed first and named by the response as committed, and
    every key the response names is listed (issue 33: a key sorting after the first 20 listed
    crashed the engine, and with it `audit` and the worker)."""
    attempts = [
        ev(f"t{i:02}", "effect_attempted", W, 17, "alpha", seq=6 + i, key=f"k{i:02}")
        for i in range(25)
    ]
    stale_commit = commit("c", 17, "alpha", seq=40, key=committed)
    f = run([*takeover(), *attempts, stale_commit]).finding(W, 17)
    assert (f.severity.value, f.sink_outcome) == ("critical", "committed")
    assert f.effect_keys[0] == committed and len(f.effect_keys) == 20
    keys = {f"k{i:02}" for i in range(25)} | {committed}
    assert f.effect_keys_omitted == len(keys) - 20
    assert f"committed {committed} after" in f.response
    named = [k for k in sorted(keys - {committed}) if k in f.response]
    assert named and set(named) <= set(f.effect_keys)
    assert f"(and {len(keys) - 3} more effect keys)" in f.response
