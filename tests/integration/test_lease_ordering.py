"""Where each `seq` comes from, and why (README, "The order of a job's events").

A displaced owner does not know it was displaced, so a sequence number it picked itself would
order its late actions before the takeover, and the detector would take them for late-delivered
evidence and stay silent. The store takes every event's seq from the job row, in the event's own
transaction; these tests run the store's real events (a real PostgreSQL) through the detector's
engine in the order a relay may publish them:

- an event the old owner recorded **before** the takeover and that is relayed **after** it keeps
  its lower seq: no finding;
- an event about the old owner's action **after** the takeover is ordered after it even when it
  is relayed **before** it: a finding.

Each also shows the same history with the seq the old owner would have picked by itself, and
the wrong verdict that gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.histories.audit import audit_lines
from detector.leases import Lease, LeaseStore, Outcome
from tests.integration.leases import job_class

OCR = job_class("ocr")


@pytest.fixture
def store(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[LeaseStore]:
    with LeaseStore(postgres_dsn, [OCR]) as s:
        yield s


def events(db: psycopg.Connection[DictRow], job_id: UUID) -> dict[int, dict[str, Any]]:
    rows = db.execute(
        "SELECT seq, event FROM tool_job_outbox WHERE job_id = %s", (job_id,)
    ).fetchall()
    return {r["seq"]: r["event"] for r in rows}


def lapse(db: psycopg.Connection[DictRow], lease: Lease) -> None:
    """End the lease now, as the database's clock would after L (without waiting for it)."""
    db.execute("UPDATE tool_jobs SET lease_until = now() WHERE id = %s", (lease.job_id,))


def findings(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the detector finds in the events, read in this order (as published)."""
    result = audit_lines(json.dumps(e).encode() for e in history)
    return [json.loads(f.to_json()) for f in result.findings.values()]


def conditions(found: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """Each condition, with the epoch it displaced."""
    return {(c["kind"], f["displaced"]["owner_epoch"]) for f in found for c in f["conditions"]}


def takeover(store: LeaseStore, db: psycopg.Connection[DictRow]) -> tuple[Lease, Lease]:
    """W1 claims and starts its request; its lease lapses; W2 claims and starts its own."""
    store.enqueue("ocr", "payment:inv-42:capture", {"invoice": 42})
    w1 = store.claim("ocr", "w1")
    assert w1 is not None
    assert store.request_started(w1, request_id="payment:inv-42:capture") == w1
    lapse(db, w1)
    w2 = store.claim("ocr", "w2")
    assert w2 is not None and w2.fencing_token == 2
    assert store.request_started(w2, request_id="payment:inv-42:capture") == w2
    return w1, w2


def test_a_request_recorded_before_the_takeover_and_relayed_after_it_is_not_stale(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    w1, _ = takeover(store, db)
    by_seq = events(db, w1.job_id)
    assert [by_seq[s]["kind"] for s in sorted(by_seq)] == [
        "job_claimed",
        "tool_request_started",
        "job_claimed",
        "tool_request_started",
    ]
    late = [by_seq[1], by_seq[3], by_seq[4], by_seq[2]]  # W1's request relayed last
    assert findings(late) == []
    # Had W1 sent it without the store's seq, only its arrival would order it: after the
    # takeover, a stale attempt that never happened.
    unordered = [{k: v for k, v in e.items() if k != "seq"} for e in late]
    assert ("stale_effect_attempt", 1) in conditions(findings(unordered))


def test_an_action_after_the_takeover_is_stale_even_when_relayed_before_it(
    store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """W1 comes back with its result after W2 claimed: the refusal is recorded at the job's next
    seq, after W2's claim, even when the relay publishes it first."""
    w1, _ = takeover(store, db)
    assert store.complete(w1, {"captured": True}) is Outcome.REJECTED
    by_seq = events(db, w1.job_id)
    assert by_seq[5]["kind"] == "result_rejected" and by_seq[5]["fencing_token"] == 1
    early = [by_seq[1], by_seq[2], by_seq[5], by_seq[3], by_seq[4]]  # W1's refusal first
    found = findings(early)
    assert ("stale_effect_rejected", 1) in conditions(found)
    assert {(f["displaced"]["owner_epoch"], f["severity"]) for f in found} == {(1, "warning")}
    # A seq W1 picked itself, counting only its own steps (its request 1, its result 2), puts
    # the refusal before W2's claim (3): nothing. (Its third event, 3, would tie with the claim,
    # which DESIGN §4 orders first: stale, by luck.)
    own = [by_seq[1], by_seq[2], {**by_seq[5], "seq": 2}, by_seq[3], by_seq[4]]
    assert ("stale_effect_rejected", 1) not in conditions(findings(own))
