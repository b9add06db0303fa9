"""The campaign checker's matching of positives with findings, on hand-made findings and on
those `audit` gives for histories the campaign met."""

from __future__ import annotations

import json
from typing import Any

import pytest

from detector.contracts.findings import Finding
from detector.histories.audit import audit_lines
from detector.testing.campaign.checker import Grade, Seen, check, positives
from detector.testing.campaign.truth import Write


def _write(epoch: int, at: float) -> Write:
    return Write(
        run=0,
        workflow_key="shard-1",
        effect_key="unit-9",
        executor=f"w{epoch}",
        epoch=epoch,
        owned=True,
        evidence="held",
        at=at,
    )


def _finding(displaced: int, current: int) -> Finding:
    doc: dict[str, Any] = {
        "schema": "splitbrain.finding/v1",
        "finding_id": f"f{displaced}",
        "revision": 1,
        "status": "open",
        "severity": "critical",
        "workflow_key": "shard-1",
        "displaced": {"worker_id": f"w{displaced}", "owner_epoch": displaced},
        "current": {"worker_id": f"w{current}", "owner_epoch": current},
        "transition": {"event_id": f"a{current}", "seq": current},
        "conditions": [
            {
                "kind": "duplicate_effect",
                "cause": "failover",
                "event_id": f"c{current}",
                "seq": current + 1,
                "effect_key": "unit-9",
                "epochs": [displaced, current],
            }
        ],
        "last_stale_event": None,
        "effect_keys": ["unit-9"],
        "sink_outcome": "committed",
        "ordering": "authoritative_seq",
        "confidence": "high",
        "evidence_lag": {"seq": 1, "seconds": 0.1},
        "response": "treat the outcome as uncertain",
        "trace_links": [],
    }
    return Finding.model_validate(doc)


def test_a_commit_recorded_late_keeps_its_place_by_seq() -> None:
    """etcd, seed 1, run 0 in CI: epoch 22 committed unit-9 at revision 24, then paused before
    it read the answer; epoch 4's zombie committed it at revision 28, epoch 30 at 34, and epoch
    22's record came last. By the revisions, as the detector orders them, 30's duplicate is in
    22's finding (the owner just before), which the checker called a false alarm when it
    ordered by `at` and put it in 4's."""
    early = _write(22, 891.17).model_copy(update={"seq": 24})
    zombie = _write(4, 888.52).model_copy(update={"seq": 28, "owned": False})
    late = _write(30, 890.50).model_copy(update={"seq": 34})
    writes = [zombie, late, early]
    assert [(p.write.epoch, p.episodes) for p in positives(writes)] == [
        (4, frozenset({4})),
        (30, frozenset({22})),
    ]
    verdict = check(writes, [Seen(_finding(22, 30), 890.6)], Grade("authoritative_seq", True))
    assert verdict.false_positives == 0, verdict.notes


def test_a_key_committed_by_three_owners_in_turn_is_two_findings_each_explained() -> None:
    """DESIGN §4: each failover duplicate belongs to the episode of the owner just before, so
    three commits make two findings; each explains one duplicate, neither is a false alarm."""
    writes = [_write(1, 1.0), _write(2, 2.0), _write(3, 3.0)]
    assert [p.episodes for p in positives(writes)] == [frozenset({1}), frozenset({2})]
    seen = [Seen(_finding(1, 2), 2.1), Seen(_finding(2, 3), 3.1)]
    verdict = check(writes, seen, Grade("authoritative_seq", destination_confirms=True))
    assert (verdict.true_positives, verdict.false_positives, verdict.false_negatives) == (2, 0, 0)
    assert verdict.misgraded == 0, verdict.notes


KEY = "default/receipts-22/run-1"
GRADE = Grade(ordering="authoritative_seq", destination_confirms=False)


def event(n: int, kind: str, worker: str, epoch: int, effect: str | None = None) -> dict[str, Any]:
    """One workflow-run event as the Temporal adapter sends it (epoch and seq: the history
    length)."""
    e: dict[str, Any] = {
        "workflow_key": KEY,
        "owner_epoch": epoch,
        "worker_id": worker,
        "attrs": {"epoch_authority": "system", "epoch_from": "temporal.history_length"},
        "kind": kind,
        "seq": epoch,
        "source": "coordinator" if kind == "lease_acquired" else "worker",
        "event_id": f"e{n}",
        "observed_at": f"2026-12-05T00:00:{n:02d}Z",
    }
    if effect is not None:
        e["effect_key"] = effect
    return e


def write(n: int, worker: str, epoch: int, owned: bool) -> Write:
    return Write(
        run=0,
        workflow_key=KEY,
        effect_key="receipt/1",
        executor=worker,
        epoch=epoch,
        owned=owned,
        evidence="history",
        at=float(n),
    )


def test_a_key_redone_after_two_displaced_epochs_explains_the_finding_of_each() -> None:
    # Task 8 times out while its worker stalls; task 11 mails the receipt, then times out too;
    # the stalled 8 wakes and mails it, and task 14 mails it again: two findings (displaced 8
    # and displaced 11), both of the same duplicates. Neither is a false alarm.
    history = [
        event(1, "lease_acquired", "w2", 11),
        event(2, "effect_committed", "w2", 11, "receipt/1"),
        event(3, "lease_acquired", "w1", 8),
        event(4, "effect_committed", "w1", 8, "receipt/1"),
        event(5, "lease_acquired", "w0", 14),
        event(6, "effect_committed", "w0", 14, "receipt/1"),
    ]
    result = audit_lines([json.dumps(e).encode() for e in history])
    findings = list(result.findings.values())
    assert sorted(f.displaced.owner_epoch for f in findings if f.displaced) == [8, 11]
    truth = [write(2, "w2", 11, True), write(4, "w1", 8, False), write(6, "w0", 14, True)]
    verdict = check(truth, [Seen(f, 10.0) for f in findings], GRADE)
    assert (verdict.false_positives, verdict.false_negatives) == (0, 0), verdict.notes


def _attempt(epoch: int, *, owned: bool, blind: str | None = None) -> Write:
    return _write(epoch, 5.0).model_copy(
        update={"owned": owned, "attempt": True, "committed": False, "blind": blind}
    )


def _stale_attempt_finding() -> Finding:
    """What the detector says of a displaced holder's attempt after the takeover, by seq."""
    doc = json.loads(_finding(1, 2).model_dump_json())
    doc["severity"] = "warning"
    doc["confidence"] = "medium"  # the attempt is the worker's word, no destination's
    doc["conditions"] = [
        {"kind": "stale_effect_attempt", "event_id": "t1", "seq": 4, "effect_key": "unit-9"}
    ]
    return Finding.model_validate(doc)


def test_a_displaced_holder_s_attempt_after_the_takeover_explains_its_warning() -> None:
    """The etcd campaign's one false warning was a real stale attempt the truth did not record:
    the holder, displaced, attempted a unit and failed before writing it."""
    grade = Grade("per_condition", destination_confirms=True)
    seen = [Seen(_stale_attempt_finding(), 5.2)]
    verdict = check([_write(2, 1.0), _attempt(1, owned=False)], seen, grade)
    assert (verdict.true_positives, verdict.false_positives, verdict.misgraded) == (1, 0, 0), (
        verdict.notes
    )
    # An attempt the truth says was owned is no positive: the same warning is then a false one.
    verdict = check([_write(2, 1.0), _attempt(1, owned=True)], seen, grade)
    assert (verdict.true_positives, verdict.false_positives) == (0, 1)
    # One the truth could not place is blind, found or not, and never a miss.
    unread = check([_attempt(1, owned=False, blind="attempt_unread")], [], grade)
    assert (unread.blind, unread.false_negatives) == (1, 0)


def test_a_commit_its_worker_s_exit_silenced_does_not_decide_the_next_duplicate_s_episode() -> None:
    """The langgraph campaign's last miss (seed 1, run 19): epoch 2's commit died unsent with
    its pod, so the detector rightly put epoch 3's duplicate in epoch 1's episode, the last one
    it heard commit the key; the truth had expected it in epoch 2's."""
    silenced = _write(2, 2.0).model_copy(update={"blind": "killed_unsent"})
    writes = [_write(1, 1.0), silenced, _write(3, 3.0)]
    assert [p.episodes for p in positives(writes)][-1] == frozenset({1})
    verdict = check(writes, [Seen(_finding(1, 3), 3.1)], Grade("authoritative_seq", True))
    assert (verdict.false_negatives, verdict.false_positives) == (0, 0), verdict.notes


def _ticket(n: int, kind: str, worker: str, epoch: int) -> dict[str, Any]:
    """A LangGraph adapter's event: a claim carries its ledger's seq, a reply (a user call) is
    confirmed by its destination without one."""
    e: dict[str, Any] = {
        "workflow_key": "ticket-0",
        "owner_epoch": epoch,
        "worker_id": worker,
        "kind": kind,
        "event_id": f"e{n}",
        "observed_at": f"2026-12-05T00:00:{n:02d}Z",
    }
    if kind == "lease_acquired":
        return e | {"seq": n}
    return e | {"source": "destination", "effect_key": "reply/ticket-0"}


@pytest.mark.parametrize(
    ("worker", "epoch", "owned"),
    [("pod-2", 1, False), ("pod-0", 2, True)],
    ids=["displaced-owner-again", "current-owner-again"],
)
def test_a_key_committed_again_by_an_epoch_that_had_is_a_retry_s_warning(
    worker: str, epoch: int, owned: bool
) -> None:
    """The langgraph campaign's misgrading (50b6f43, seed 1, run 17): pod-2 replied, lost its
    claim in a partition, and its retried attempt replied again after pod-0's takeover and
    reply. DESIGN §4 makes that reply a stale commit in epoch 1's finding (critical) and a retry
    of epoch 1's own, a finding of its own (a warning); the checker wanted both critical. So it
    did when the current owner replies twice."""
    history = [
        _ticket(1, "lease_acquired", "pod-2", 1),
        _ticket(2, "effect_committed", "pod-2", 1),
        _ticket(3, "lease_acquired", "pod-0", 2),
        _ticket(4, "effect_committed", "pod-0", 2),
        _ticket(5, "effect_committed", worker, epoch),
    ]
    findings = audit_lines([json.dumps(e).encode() for e in history]).findings.values()
    assert sorted((f.displaced is None, str(f.severity)) for f in findings) == [
        (False, "critical"),
        (True, "warning"),
    ]
    truth = [
        Write(
            run=0,
            workflow_key="ticket-0",
            effect_key="reply/ticket-0",
            executor=e["worker_id"],
            epoch=e["owner_epoch"],
            owned=owned or n < len(history),  # the last reply is the case's
            evidence="the checkpoint's children",
            at=float(n),
        )
        for n, e in enumerate(history, start=1)
        if e["kind"] == "effect_committed"
    ]
    verdict = check(truth, [Seen(f, 6.0) for f in findings], Grade("per_condition", True))
    assert (verdict.false_positives, verdict.false_negatives, verdict.misgraded) == (0, 0, 0), (
        verdict.notes
    )
