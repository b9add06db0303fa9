"""The campaign checker's matching of positives with findings."""

from __future__ import annotations

from typing import Any

from detector.contracts.findings import Finding
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


def test_a_key_committed_by_three_owners_in_turn_is_two_findings_each_explained() -> None:
    """DESIGN §4: each failover duplicate belongs to the episode of the owner just before, so
    three commits make two findings; each explains one duplicate, neither is a false alarm."""
    writes = [_write(1, 1.0), _write(2, 2.0), _write(3, 3.0)]
    assert [p.episodes for p in positives(writes)] == [frozenset({1}), frozenset({2})]
    seen = [Seen(_finding(1, 2), 2.1), Seen(_finding(2, 3), 3.1)]
    verdict = check(writes, seen, Grade("authoritative_seq", destination_confirms=True))
    assert (verdict.true_positives, verdict.false_positives, verdict.false_negatives) == (2, 0, 0)
    assert verdict.misgraded == 0, verdict.notes
