"""Duplicate effects: failover across owners and retry within one owner."""

from __future__ import annotations

import random

from detector.contracts.events import OwnershipEvent
from detector.core import Config, Detector

from ..histories import W, acq, commit, conds, epochs, ev, run, takeover, verify


def test_failover_duplicate_after_a_clean_handoff() -> None:
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


def test_failover_duplicate_witness_is_later_commit_even_when_it_arrives_first() -> None:
    r = run([*takeover(), commit("c18", 18, "beta", 7), commit("c17", 17, "alpha", 3)])
    f = r.finding(W, 17)
    # c17 (seq 3) predates the takeover: not stale, but the effect happened twice
    assert conds(f) == [("duplicate_effect", 7, "failover")]
    assert f.conditions[0].event_id == "c18"
    assert f.severity.value == "critical"


def test_failover_epochs_do_not_depend_on_arrival_order() -> None:
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


def test_failover_confidence_does_not_depend_on_arrival_order() -> None:
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


def test_retry_duplicate_is_its_own_finding_without_displaced_owner() -> None:
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
    assert f.current is not None and f.current.owner_epoch == 3
    assert (f.severity.value, f.status.value) == ("warning", "open")
    assert conds(f) == [("duplicate_effect", 3, "retry")]
    assert f.conditions[0].event_id == "c2"
    assert f.effect_keys == ["reply-to/msg-8f2"]
    assert "committed twice" in f.response


def test_worker_claim_plus_destination_confirmation_is_not_a_retry() -> None:
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


def test_stale_retry_gives_a_retry_finding_and_a_displaced_finding() -> None:
    r = run([*takeover(), commit("c1", 17, "alpha", 6), commit("c2", 17, "alpha", 7)])
    displaced = r.finding(W, 17)
    retry = r.finding(W, None)
    assert displaced.finding_id != retry.finding_id
    assert conds(displaced) == [("stale_effect_committed", 6, None)]
    assert conds(retry) == [("duplicate_effect", 7, "retry")]
    assert retry.severity.value == "warning"
    assert displaced.severity.value == "critical"


def test_a_duplicate_names_its_commits_owners_and_the_current_owner_entitled_to_act() -> None:
    # K committed under epoch 2 (a) before any takeover, then under epoch 3 (b) after epoch 4
    # (c) took over: the duplicate of epochs 2 and 3 is latest at seq 5, when c is current.
    wf = "celery/dup"
    r = run(
        [
            acq("a2", 2, "a", 1, wf),
            commit("c2", 2, "a", 2, wf=wf),
            acq("a3", 3, "b", 3, wf),
            acq("a4", 4, "c", 4, wf),
            commit("c3", 3, "b", 5, wf=wf),
        ]
    )
    f = r.finding(wf, 2)
    assert epochs(f) == (2, 4)
    assert ("duplicate_effect", 5, "failover") in conds(f)
    assert "two owners (a (epoch 2) and b (epoch 3))" in f.response
    assert "do not auto-retry c (epoch 4), the owner now entitled to act." in f.response
    assert "do not auto-retry b (epoch 3)" not in f.response


def test_a_retry_names_both_workers_and_the_current_owner() -> None:
    wf = "retry-two-workers"
    r = run(
        [
            acq("a5", 5, "w1", 1, wf),
            commit("k1", 5, "w1", 2, wf=wf),
            commit("k2", 5, "w2", 3, wf=wf),
        ]
    )
    f = r.finding(wf, None, retry_epoch=5)
    assert "once by w1 and once by w2 (epoch 5)" in f.response
    assert f.response.endswith("w1 (epoch 5) is the owner now entitled to act.")


def test_every_stale_response_names_the_current_owner_entitled_to_act() -> None:
    f = run([*takeover(), ev("p", "progress", W, 17, "alpha", seq=6)]).finding(W, 17)
    assert f.response.endswith("beta (epoch 18) is the owner now entitled to act.")


# ---- a key committed under many epochs (DESIGN §4: the duplicate of two consecutive ones) -------


def _handoffs(owners: int, wf: str = W) -> list[OwnershipEvent]:
    """Owners 1..N in turn, each acquiring, committing K and releasing (clean handoffs)."""
    out: list[OwnershipEvent] = []
    for e in range(1, owners + 1):
        out += [
            acq(f"a{e}", e, f"w{e}", 4 * e, wf),
            commit(f"c{e}", e, f"w{e}", 4 * e + 1, wf=wf),
            ev(f"r{e}", "lease_released", wf, e, f"w{e}", seq=4 * e + 2),
        ]
    return out


def test_a_key_recommitted_by_each_of_n_owners_gives_n_minus_1_findings_one_revision_each() -> None:
    n = 12
    r = run(_handoffs(n))
    found = sorted(r.findings(), key=lambda f: f.displaced.owner_epoch if f.displaced else -1)
    assert len(found) == n - 1
    for i, f in enumerate(found, start=1):
        assert f.revision == 1 and len(r.revisions(f.finding_id)) == 1
        assert epochs(f) == (i, i + 1)
        (c,) = f.conditions
        assert (c.kind.value, c.cause, c.epochs, c.event_id) == (
            "duplicate_effect",
            "failover",
            [i, i + 1],
            f"c{i + 1}",
        )
        assert f"w{i} (epoch {i}) and w{i + 1} (epoch {i + 1})" in f.response
    assert len(r.updates) == n - 1  # each commit changed one finding


def test_recommitted_key_findings_do_not_depend_on_arrival_order() -> None:
    n = 9
    history = _handoffs(n)
    straight = {f.finding_id: f.model_dump(exclude={"revision"}) for f in run(history).findings()}
    for seed in range(12):
        shuffled = list(history)
        random.Random(seed).shuffle(shuffled)
        found = run(shuffled).findings()
        assert sorted(epochs(f) for f in found) == [(e, e + 1) for e in range(1, n)]
        got = {f.finding_id: f.model_dump(exclude={"revision"}) for f in found}
        assert got == straight, seed


def test_a_late_commit_between_two_epochs_takes_the_place_of_their_pair() -> None:
    """Epochs 5 and 7 committed K; 6's commit arrives last. Finding 5 ends as if (5, 7) had
    never been added: its witness, epochs, current owner and what waits for a verifier (a
    verification after 6's commit and before 7's settles 5's duplicate, not 6's)."""
    a5, a6, a7 = acq("a5", 5, "w5", 1), acq("a6", 6, "w6", 4), acq("a7", 7, "w7", 8)
    c5 = commit("c5", 5, "w5", 2, source="destination")
    c6 = commit("c6", 6, "w6", 5, source="worker")
    c7 = commit("c7", 7, "w7", 9, source="destination")
    fences = [
        ev("r5", "lease_released", W, 5, "w5", seq=3),
        ev("r6", "lease_released", W, 6, "w6", seq=7),
    ]
    v = verify("v", 6)
    in_order = run([a5, c5, fences[0], a6, c6, v, fences[1], a7, c7])
    late = run([a5, c5, fences[0], a6, fences[1], a7, c7, v, c6])
    for r in (in_order, late):
        five, six = r.finding(W, 5), r.finding(W, 6)
        assert [c.epochs for c in five.conditions] == [[5, 6]]
        assert five.conditions[0].event_id == "c6"
        assert five.current is not None and five.current.owner_epoch == 6
        assert "w5 (epoch 5) and w6 (epoch 6)" in five.response
        assert five.status.value == "resolved"  # verified after both of its commits
        assert five.confidence == "medium"  # 6's commit has no destination's word
        assert [c.epochs for c in six.conditions] == [[6, 7]]
        assert six.status.value == "open"  # 7's commit is after the verification
    assert late.finding(W, 5).model_dump(exclude={"revision"}) == in_order.finding(W, 5).model_dump(
        exclude={"revision"}
    )
    assert late.finding(W, 6).model_dump(exclude={"revision"}) == in_order.finding(W, 6).model_dump(
        exclude={"revision"}
    )


def test_a_chain_of_zombies_committing_one_key_revises_one_finding_per_commit() -> None:
    """Each displaced owner commits K after its takeover: its own finding gets the stale commit,
    the owner just before it the duplicate; no earlier finding changes."""
    n = 10
    history = [acq("a1", 1, "w1", 1)]
    for e in range(2, n + 1):
        history += [
            acq(f"a{e}", e, f"w{e}", 2 * e),
            commit(f"c{e - 1}", e - 1, f"w{e - 1}", 2 * e + 1),
        ]
    r = run(history)
    per_event = [0] * len(history)
    d = Detector(Config())
    for i, event in enumerate(history):
        per_event[i] = len(d.observe(event))
    assert max(per_event) <= 2
    for e in range(1, n - 1):
        f = r.finding(W, e)
        dup = [c for c in f.conditions if c.kind.value == "duplicate_effect"]
        assert [c.epochs for c in dup] == [[e, e + 1]]
