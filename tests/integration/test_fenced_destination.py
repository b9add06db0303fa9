"""The fenced destination against a real PostgreSQL (issue 10, item 4; issue 38): a fence other
than the job's current token refused with a receipt (a displaced owner's, or one the store never
issued), fences never compared across jobs, one effect per idempotency key, the unfenced mode,
concurrent requests, the HTTP service, and the receipt's place in the job's order.

Each test has a fresh database of the session's server (`postgres_dsn`). A takeover is a real
one: the first owner's one-second lease lapses on the database's clock, and another owner
claims the job under the next token.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.contracts.events import Kind, OwnershipEvent, Source, parse_event_obj
from detector.devstack.postgres import LocalPostgres
from detector.errors import ExitCode
from detector.histories.audit import audit_lines
from detector.leases import (
    Decision,
    EffectRequest,
    FencedDestination,
    IdempotencyKeyReusedError,
    Labels,
    Lease,
    LeaseInputError,
    LeaseStore,
    Receipt,
    UnknownJobError,
    migrate,
)
from detector.leases.db import connect
from detector.leases.http_destination import DestinationServer
from detector.leases.inspect import NotMigratedError
from detector.leases.schema import MIGRATIONS
from tests.integration.leases import claimed, job_class, outbox, wait_lapsed

OCR = job_class("ocr")
NAME = "invoices"
ENTITY = "invoice-42"


@pytest.fixture
def store(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[LeaseStore]:
    with LeaseStore(postgres_dsn, [OCR]) as s:
        yield s


@pytest.fixture
def destination(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> Iterator[FencedDestination]:
    with FencedDestination(postgres_dsn, NAME) as d:
        yield d


def takeover(store: LeaseStore, db: psycopg.Connection[DictRow]) -> tuple[Lease, Lease]:
    """W1 claims the job (token 1), its lease lapses, W2 claims it (token 2)."""
    store.enqueue("ocr", "invoice:42:capture", {"invoice": 42}, Labels(tool_class="ocr"))
    w1 = claimed(store.claim("ocr", "w1"))
    wait_lapsed(db, w1)
    w2 = claimed(store.claim("ocr", "w2"))
    assert (w1.fencing_token, w2.fencing_token) == (1, 2)
    return w1, w2


def effect(
    lease: Lease,
    key: str,
    *,
    entity: str = ENTITY,
    fence: int | None = None,
    effect_key: str | None = None,
) -> EffectRequest:
    """What `lease`'s owner presents (its token, unless `fence` says otherwise)."""
    return EffectRequest(
        job_id=lease.job_id,
        worker_id=lease.owner_id,
        fence=lease.fencing_token if fence is None else fence,
        idempotency_key=key,
        entity=entity,
        effect_key=effect_key,
    )


def last_event(db: psycopg.Connection[DictRow], job_id: UUID) -> OwnershipEvent:
    return parse_event_obj(outbox(db, job_id)[-1])


def effects(db: psycopg.Connection[DictRow]) -> list[dict[str, Any]]:
    return db.execute(
        "SELECT id, entity, idempotency_key, fence, payload FROM fenced_effects ORDER BY id"
    ).fetchall()


def entity_fence(db: psycopg.Connection[DictRow], entity: str = ENTITY) -> int:
    row = db.execute(
        "SELECT fence FROM fenced_entities WHERE destination = %s AND entity = %s",
        (NAME, entity),
    ).fetchone()
    assert row is not None
    return int(row["fence"])


def count(db: psycopg.Connection[DictRow], table: str) -> int:
    row = db.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
    assert row is not None
    return int(row["n"])


def findings(db: psycopg.Connection[DictRow], job_id: UUID) -> set[tuple[str, int]]:
    """What the detector finds in the job's outbox: each condition with the epoch displaced."""
    result = audit_lines(json.dumps(e).encode() for e in outbox(db, job_id))
    found = [json.loads(f.to_json()) for f in result.findings.values()]
    return {(c["kind"], f["displaced"]["owner_epoch"]) for f in found for c in f["conditions"]}


# -- the fence ----------------------------------------------------------------------------------


def test_a_lower_fence_is_rejected_with_a_receipt_and_an_effect_rejected_event(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    w1, w2 = takeover(store, db)
    done = destination.apply(effect(w2, "invoice:42:capture"), {"amount": 100})
    assert (done.decision, done.fence_held) == (Decision.ACCEPTED, 2)

    refused = destination.apply(effect(w1, "invoice:42:refund"), {"amount": -100})
    assert isinstance(refused, Receipt) and not refused.accepted
    assert (refused.status, refused.repeated, refused.result) == ("rejected", False, None)
    # What was refused, the fence presented, the fence held.
    assert (refused.entity, refused.effect_key, refused.idempotency_key) == (
        ENTITY,
        "invoice:42:refund",
        "invoice:42:refund",
    )
    assert (refused.worker_id, refused.fence, refused.fence_held) == ("w1", 1, 2)
    assert (refused.job_id, refused.seq) == (w1.job_id, 4)  # claim, claim, commit, this

    event = last_event(db, w1.job_id)
    assert (event.kind, event.source, event.seq) == (Kind.EFFECT_REJECTED, Source.DESTINATION, 4)
    assert (event.owner_epoch, event.worker_id, event.workflow_key) == (1, "w1", str(w1.job_id))
    assert (event.effect_key, event.destination) == ("invoice:42:refund", NAME)
    assert event.event_id == f"{w1.job_id}:4" and event.attrs == {"tool_class": "ocr"}
    raw = outbox(db, w1.job_id)[-1]
    assert raw["detail"] == {
        "job_class": "ocr",
        "attempt": None,  # a displaced owner's: not the job's current attempt
        "entity": ENTITY,
        "idempotency_key": "invoice:42:refund",
        "fence_held": 2,
        "fenced": True,
        "refused": "stale",
        "job_fence": 2,
        "job_state": "running",
        "payload_sha256": raw["detail"]["payload_sha256"],
    }
    assert [e["idempotency_key"] for e in effects(db)] == ["invoice:42:capture"]
    assert entity_fence(db) == 2
    assert ("stale_effect_rejected", 1) in findings(db, w1.job_id)


def test_the_current_owners_fence_is_accepted_with_effect_committed(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "invoice:42:ocr", {})
    w1 = claimed(store.claim("ocr", "w1"))
    first = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    second = destination.apply(
        effect(w1, "invoice:42:email", effect_key="mail:invoice-42"), {"to": "billing"}
    )
    assert [(r.status, r.fence, r.fence_held, r.seq) for r in (first, second)] == [
        ("accepted", 1, 1, 2),
        ("accepted", 1, 1, 3),  # the same owner may make several effects on one entity
    ]
    assert first.result == {"effect_id": effects(db)[0]["id"]}

    wait_lapsed(db, w1)
    w2 = claimed(store.claim("ocr", "w2"))
    third = destination.apply(effect(w2, "invoice:42:void"), {"reason": "duplicate"})
    assert (third.status, third.fence, third.fence_held, third.seq) == ("accepted", 2, 2, 5)
    assert entity_fence(db) == 2

    events = outbox(db, w1.job_id)
    committed = [parse_event_obj(e) for e in events if e["kind"] == "effect_committed"]
    assert [(e.owner_epoch, e.worker_id, e.effect_key, e.seq) for e in committed] == [
        (1, "w1", "invoice:42:capture", 2),
        (1, "w1", "mail:invoice-42", 3),
        (2, "w2", "invoice:42:void", 5),
    ]
    assert {(e.source, e.destination, e.kind) for e in committed} == {
        (Source.DESTINATION, NAME, Kind.EFFECT_COMMITTED)
    }
    # The current owner's attempt is the job's.
    assert [e["detail"]["attempt"] for e in events if e["kind"] == "effect_committed"] == [1, 1, 2]
    assert [(e["fence"], e["payload"]) for e in effects(db)] == [
        (1, {"amount": 100}),
        (1, {"to": "billing"}),
        (2, {"reason": "duplicate"}),
    ]
    assert findings(db, w1.job_id) == set()


# -- one effect per idempotency key -------------------------------------------------------------


def test_a_repeated_key_returns_the_earlier_receipt_and_makes_no_second_effect_or_event(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    calls: list[int] = []

    def capture(conn: psycopg.Connection[DictRow]) -> Any:
        calls.append(1)
        conn.execute(
            "INSERT INTO fenced_effects (destination, entity, idempotency_key, fence, payload)"
            " VALUES (%s, %s, %s, %s, %s)",
            (NAME, ENTITY, "invoice:42:capture", 1, json.dumps({"amount": 100})),
        )
        return {"captured": 100, "at": "psp-ref-7"}

    store.enqueue("ocr", "invoice:42:ocr", {})
    w1 = claimed(store.claim("ocr", "w1"))
    first = destination.apply(effect(w1, "invoice:42:capture"), capture)
    assert (first.status, first.result) == ("accepted", {"captured": 100, "at": "psp-ref-7"})
    before = (outbox(db, w1.job_id), effects(db), count(db, "fenced_receipts"))

    again = destination.apply(effect(w1, "invoice:42:capture"), capture)
    assert (again.status, again.repeated, again.decision) == ("repeated", True, Decision.ACCEPTED)
    assert again == Receipt(**{**_fields(first), "repeated": True})
    # To the job's next owner, after a takeover, and to the displaced owner's own retry: the
    # stored receipt, nothing done.
    wait_lapsed(db, w1)
    w2 = claimed(store.claim("ocr", "w2"))
    assert destination.apply(effect(w2, "invoice:42:capture"), {"amount": 1}) == again
    assert destination.apply(effect(w1, "invoice:42:capture"), {"amount": 1}) == again
    assert calls == [1]
    after = (outbox(db, w1.job_id), effects(db), count(db, "fenced_receipts"))
    assert after[1:] == before[1:]
    assert after[0][: len(before[0])] == before[0] and len(after[0]) == len(before[0]) + 1
    assert after[0][-1]["kind"] == "job_claimed"  # w2's claim: no event of the repeats
    # Under any other fence, below the job's token or above it (one the store never issued),
    # the key is refused, never handed the accepted receipt.
    for fence, why in ((0, "stale"), (7, "unissued")):
        wrong = destination.apply(effect(w2, "invoice:42:capture", fence=fence), {"amount": 1})
        assert (wrong.status, wrong.fence, wrong.fence_held) == ("rejected", fence, 2)
        assert outbox(db, w1.job_id)[-1]["kind"] == "effect_rejected"
        assert outbox(db, w1.job_id)[-1]["detail"]["refused"] == why
    assert calls == [1] and effects(db) == before[1]
    after = (outbox(db, w1.job_id), effects(db), count(db, "fenced_receipts"))

    # A key names one operation: another entity or effect key under it is refused.
    with pytest.raises(IdempotencyKeyReusedError, match="idempotency_key: already used for"):
        destination.apply(effect(w2, "invoice:42:capture", entity="invoice-43"), {})
    with pytest.raises(IdempotencyKeyReusedError):
        destination.apply(effect(w2, "invoice:42:capture", effect_key="other"), {})
    assert (outbox(db, w1.job_id), effects(db)) == (after[0], after[1])


def _fields(receipt: Receipt) -> dict[str, Any]:
    return {name: getattr(receipt, name) for name in Receipt.__slots__}


def test_a_rejection_does_not_use_up_the_key_for_the_newer_owner(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """The job's key names its operation, not an attempt: the owner that displaced a refused one
    sends the same key and must be able to make the effect. The refused owner's retries get the
    stored refusal."""
    w1, w2 = takeover(store, db)
    destination.apply(effect(w2, "invoice:42:lock"), {})
    refused = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert (refused.status, refused.seq) == ("rejected", 4)
    retried = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert (retried.status, retried.decision, retried.seq) == ("repeated", Decision.REJECTED, 4)
    done = destination.apply(effect(w2, "invoice:42:capture"), {"amount": 100})
    assert (done.status, done.fence, done.seq) == ("accepted", 2, 5)
    late = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert (late.status, late.decision, late.fence, late.seq) == ("repeated", "rejected", 1, 4)
    assert [e["kind"] for e in outbox(db, w1.job_id)] == [
        "job_claimed",
        "job_claimed",
        "effect_committed",
        "effect_rejected",
        "effect_committed",
    ]
    assert [e["idempotency_key"] for e in effects(db)] == ["invoice:42:lock", "invoice:42:capture"]


def test_an_effect_that_fails_leaves_no_receipt_no_event_and_the_key_free(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """The effect, its receipt and its event are one transaction: all or nothing."""

    class PaymentDeclinedError(Exception):
        pass

    def declined(conn: psycopg.Connection[DictRow]) -> Any:
        conn.execute(
            "INSERT INTO fenced_effects (destination, entity, idempotency_key, fence, payload)"
            " VALUES (%s, %s, 'half-done', 1, '{}')",
            (NAME, ENTITY),
        )
        raise PaymentDeclinedError

    store.enqueue("ocr", "invoice:42:ocr", {})
    w1 = claimed(store.claim("ocr", "w1"))
    with pytest.raises(PaymentDeclinedError):
        destination.apply(effect(w1, "invoice:42:capture"), declined)
    with pytest.raises(LeaseInputError, match="result: not JSON"):
        destination.apply(effect(w1, "invoice:42:capture"), lambda conn: object())
    assert [e["kind"] for e in outbox(db, w1.job_id)] == ["job_claimed"]
    tables = ("fenced_entities", "fenced_receipts", "fenced_effects")
    assert [count(db, t) for t in tables] == [0, 0, 0]
    done = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert (done.status, done.fence_held, done.seq) == ("accepted", 1, 2)


# -- the job's token, and the three orders of a displaced owner's effect ------------------------


def test_a_displaced_owner_is_refused_before_its_successor_writes_to_the_entity(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """W1's late effect lands between the takeover and W2's first write: nothing was written to
    the entity yet, the job's token refuses it; W2 then makes the effect under the same key,
    once."""
    w1, w2 = takeover(store, db)
    late = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert (late.status, late.fence, late.fence_held) == ("rejected", 1, 2)
    raw = outbox(db, w1.job_id)[-1]
    assert raw["kind"] == "effect_rejected"
    assert (raw["detail"]["refused"], raw["detail"]["job_fence"]) == ("stale", 2)
    done = destination.apply(effect(w2, "invoice:42:capture"), {"amount": 100})
    assert (done.status, done.fence, done.fence_held) == ("accepted", 2, 2)
    assert [(e["idempotency_key"], e["fence"]) for e in effects(db)] == [("invoice:42:capture", 2)]
    assert findings(db, w1.job_id) == {("stale_effect_rejected", 1)}


def test_an_effect_landed_before_the_takeover_is_repeated_to_the_successor_only(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """W1's effect lands before the cut: W2's request under the same key is `repeated`, nothing
    is done twice, and W1 cannot then commit another key, under its old token or under a fence
    it claims for another job."""
    store.enqueue("ocr", "invoice:42:capture", {}, Labels(tool_class="ocr"))
    w1 = claimed(store.claim("ocr", "w1"))
    first = destination.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert first.status == "accepted"
    wait_lapsed(db, w1)
    w2 = claimed(store.claim("ocr", "w2"))
    again = destination.apply(effect(w2, "invoice:42:capture"), {"amount": 100})
    assert (again.status, again.decision, again.fence) == ("repeated", Decision.ACCEPTED, 1)
    assert entity_fence(db) == 1  # the highest fence accepted on it: a record only
    other_job = store.enqueue("ocr", "invoice:42:refund", {}).id
    for job_id, why, held in ((w1.job_id, "stale", 2), (other_job, "unissued", 0)):
        stale = destination.apply(
            EffectRequest(
                job_id=job_id,
                worker_id="w1",
                fence=1,
                idempotency_key=f"invoice:42:refund:{job_id}",
                entity=ENTITY,
            ),
            {"amount": -100},
        )
        assert (stale.status, stale.fence_held) == ("rejected", held)
        assert outbox(db, job_id)[-1]["detail"]["refused"] == why
    assert [e["idempotency_key"] for e in effects(db)] == ["invoice:42:capture"]
    assert {kind for kind, _ in findings(db, w1.job_id)} <= {"stale_effect_rejected"}


# -- fences are per job, and only the store issues them (issue 38) -----------------------------


def test_a_second_job_on_one_entity_is_accepted_under_its_own_lower_token(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """A capture job on invoice 42 reaches token 3 (two takeovers) and writes; a refund job on the
    same invoice, at its own token 1, is its current owner and must be accepted. The capture
    job's displaced owner is still refused."""
    store.enqueue("ocr", "invoice:42:capture", {})
    first = claimed(store.claim("ocr", "c1"))
    wait_lapsed(db, first)
    second = claimed(store.claim("ocr", "c2"))
    wait_lapsed(db, second)
    capture = claimed(store.claim("ocr", "c3"))
    assert capture.fencing_token == 3
    done = destination.apply(effect(capture, "invoice:42:capture"), {"amount": 100})
    assert (done.status, done.fence, done.fence_held) == ("accepted", 3, 3)

    store.enqueue("ocr", "invoice:42:refund", {})
    refund = claimed(store.claim("ocr", "r1"))
    assert (refund.job_id != capture.job_id, refund.fencing_token) == (True, 1)
    refunded = destination.apply(effect(refund, "invoice:42:refund"), {"amount": -100})
    assert (refunded.status, refunded.fence, refunded.fence_held) == ("accepted", 1, 1)
    # And a stage of the refund job, after the capture job wrote again at 3.
    destination.apply(effect(capture, "invoice:42:receipt"), {"mail": "billing"})
    noted = destination.apply(effect(refund, "invoice:42:refund:note"), {"note": "partial"})
    assert noted.status == "accepted"

    late = destination.apply(effect(second, "invoice:42:void"), {})
    assert (late.status, late.fence, late.fence_held) == ("rejected", 2, 3)
    assert outbox(db, capture.job_id)[-1]["detail"]["refused"] == "stale"
    assert [(e["idempotency_key"], e["fence"]) for e in effects(db)] == [
        ("invoice:42:capture", 3),
        ("invoice:42:refund", 1),
        ("invoice:42:receipt", 3),
        ("invoice:42:refund:note", 1),
    ]
    assert findings(db, refund.job_id) == set()
    assert findings(db, capture.job_id) == {("stale_effect_rejected", 2)}


def test_a_fence_the_store_never_issued_is_refused_and_the_owner_still_writes(
    postgres_dsn: str, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """Fence 5 on a job whose token is 1 is refused (409 over HTTP), and the real owner, under
    token 1, is then accepted. The refusal does not use up the key at fence 5 for an owner the
    store does issue 5 to later."""
    store.enqueue("ocr", "invoice:42:capture", {})
    w1 = claimed(store.claim("ocr", "w1"))
    path = f"/effects/{ENTITY}"
    with DestinationServer(postgres_dsn, NAME) as server:
        client = Client(server.port)
        status, forged = client.post(path, headers_of(w1, "invoice:42:capture", fence=5), {})
        assert (status, forged["status"], forged["fence"], forged["fence_held"]) == (
            409,
            "rejected",
            5,
            1,
        )
        raw = outbox(db, w1.job_id)[-1]
        assert (raw["kind"], raw["detail"]["refused"], raw["detail"]["job_fence"]) == (
            "effect_rejected",
            "unissued",
            1,
        )
        status, again = client.post(path, headers_of(w1, "invoice:42:capture", fence=5), {})
        assert (status, again["status"], again["decision"]) == (409, "repeated", "rejected")
        status, owned = client.post(path, headers_of(w1, "invoice:42:capture"), {"amount": 1})
        assert (status, owned["status"], owned["fence"]) == (200, "accepted", 1)
        assert effects(db)[0]["payload"] == {"amount": 1}
        # Another key, after the forged fence: the owner is not displaced by it.
        status, more = client.post(path, headers_of(w1, "invoice:42:email"), {})
        assert (status, more["status"]) == (200, "accepted")
    # The refusal of a fence nobody held does not make the detector take the owner for displaced.
    assert findings(db, w1.job_id) == set()

    with FencedDestination(postgres_dsn, NAME) as destination:
        store.enqueue("ocr", "invoice:43:capture", {})
        v1 = claimed(store.claim("ocr", "v1"))
        early = destination.apply(effect(v1, "invoice:43:capture", fence=2), {})
        assert (early.status, early.fence_held) == ("rejected", 1)
        wait_lapsed(db, v1)
        v2 = claimed(store.claim("ocr", "v2"))
        assert v2.fencing_token == 2
        made = destination.apply(effect(v2, "invoice:43:capture"), {})
        assert (made.status, made.fence, made.repeated) == ("accepted", 2, False)
        assert destination.apply(effect(v2, "invoice:43:capture"), {}).status == "repeated"
    assert [e["idempotency_key"] for e in effects(db)] == [
        "invoice:42:capture",
        "invoice:42:email",
        "invoice:43:capture",
    ]


def test_the_token_of_a_job_no_longer_running_is_refused(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """An owner whose attempt was recorded as failed (the job queued for a retry, its token
    unchanged) or whose job succeeded makes no further effect under that token."""
    store.enqueue("ocr", "invoice:42:ocr", {})
    w1 = claimed(store.claim("ocr", "w1"))
    store.fail(w1, {"error": "timeout"}, retryable=True)
    late = destination.apply(effect(w1, "invoice:42:capture"), {})
    assert (late.status, late.fence, late.fence_held) == ("rejected", 1, 1)
    detail = outbox(db, w1.job_id)[-1]["detail"]
    assert (detail["refused"], detail["job_state"]) == ("not_running", "queued")
    w2 = claimed(store.claim("ocr", "w2"))
    assert destination.apply(effect(w2, "invoice:42:capture"), {}).status == "accepted"
    store.complete(w2, {"ok": True})
    after = destination.apply(effect(w2, "invoice:42:email"), {})
    assert after.status == "rejected"
    assert outbox(db, w1.job_id)[-1]["detail"]["job_state"] == "succeeded"
    assert [e["idempotency_key"] for e in effects(db)] == ["invoice:42:capture"]


# -- the unfenced mode --------------------------------------------------------------------------


def test_the_unfenced_mode_accepts_a_stale_fence_and_records_it(
    postgres_dsn: str,
    store: LeaseStore,
    destination: FencedDestination,
    db: psycopg.Connection[DictRow],
) -> None:
    w1, w2 = takeover(store, db)
    destination.apply(effect(w2, "invoice:42:capture"), {"amount": 100})
    with FencedDestination(postgres_dsn, NAME, fenced=False) as unfenced:
        stale = unfenced.apply(effect(w1, "invoice:42:refund"), {"amount": -100})
        assert (stale.status, stale.fence, stale.fence_held, stale.seq) == ("accepted", 1, 2, 4)
        # One owner's retry (same key, same fence) is answered from its receipt.
        again = unfenced.apply(effect(w1, "invoice:42:refund"), {"amount": -100})
        assert again.status == "repeated" and again.seq == 4
    event = last_event(db, w1.job_id)
    assert (event.kind, event.source, event.owner_epoch, event.worker_id, event.seq) == (
        Kind.EFFECT_COMMITTED,
        Source.DESTINATION,
        1,
        "w1",
        4,
    )
    assert outbox(db, w1.job_id)[-1]["detail"]["fenced"] is False
    assert [(e["idempotency_key"], e["fence"]) for e in effects(db)] == [
        ("invoice:42:capture", 2),
        ("invoice:42:refund", 1),
    ]
    # But a displaced owner's request under a key its successor used makes the effect again:
    # what an unfenced destination does, and what the detector calls a failover duplicate.
    with FencedDestination(postgres_dsn, NAME, fenced=False) as unfenced:
        twice = unfenced.apply(effect(w1, "invoice:42:capture"), {"amount": 100})
    assert (twice.status, twice.fence) == ("accepted", 1)
    captures = [e["fence"] for e in effects(db) if e["idempotency_key"] == "invoice:42:capture"]
    assert captures == [2, 1]
    assert entity_fence(db) == 2  # the highest fence seen
    assert ("stale_effect_committed", 1) in findings(db, w1.job_id)


# -- concurrency ----------------------------------------------------------------------------------


Ask = tuple[Lease, int, str]  # whose request, under which fence, with which key


def race(dsn: str, entity: str, asks: list[Ask]) -> list[Receipt]:
    """One request per ask, each on its own connection, released at once; each effect holds its
    transaction open a little while."""
    start = threading.Barrier(len(asks))
    receipts: list[Receipt] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def request(lease: Lease, fence: int, key: str) -> None:
        def slow(conn: psycopg.Connection[DictRow]) -> Any:
            conn.execute("SELECT pg_sleep(0.02)")
            row = conn.execute(
                "INSERT INTO fenced_effects (destination, entity, idempotency_key, fence, payload)"
                " VALUES (%s, %s, %s, %s, '{}') RETURNING id",
                (NAME, entity, key, fence),
            ).fetchone()
            assert row is not None
            return {"effect_id": row["id"]}

        try:
            with FencedDestination(dsn, NAME) as own:
                start.wait()
                got = own.apply(effect(lease, key, entity=entity, fence=fence), slow)
            with lock:
                receipts.append(got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=request, args=ask) for ask in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return receipts


def test_concurrent_requests_of_many_jobs_on_one_entity_each_meet_their_own_token(
    postgres_dsn: str,
    store: LeaseStore,
    destination: FencedDestination,
    db: psycopg.Connection[DictRow],
) -> None:
    """Eight jobs race on one entity: each owner's own key under its token is accepted, whatever
    the others wrote; a fence above a job's token is refused; and one key sent by all eight is
    made once, the others getting its receipt."""
    rng = random.Random(7)
    for n in range(8):
        store.enqueue("ocr", f"job:{n}", {})
    leases = [claimed(store.claim("ocr", f"w{n}")) for n in range(8)]
    for round_ in range(3):
        entity = f"invoice-{round_}"
        asks: list[Ask] = []
        for n, lease in enumerate(leases):
            asks += [
                (lease, 1, f"{entity}:own:{n}"),
                (lease, 2, f"{entity}:unissued:{n}"),
                (lease, 1, f"{entity}:shared"),
            ]
        rng.shuffle(asks)
        receipts = race(postgres_dsn, entity, asks)

        def kinds(part: str, got: list[Receipt] = receipts) -> list[str]:
            return sorted(r.status for r in got if f":{part}" in r.idempotency_key)

        assert kinds("own") == ["accepted"] * 8
        assert kinds("unissued") == ["rejected"] * 8
        assert kinds("shared") == ["accepted"] + ["repeated"] * 7
        made = [e for e in effects(db) if e["entity"] == entity]
        assert len(made) == 9 and len({e["idempotency_key"] for e in made}) == 9
    # Each decision (not a repeat) is one event in its job's outbox, after the job's claim.
    assert sum(len(outbox(db, lease.job_id)) for lease in leases) == 8 + 3 * (8 + 8 + 1)


# -- errors -------------------------------------------------------------------------------------


def test_an_unknown_job_or_bad_input_is_refused_and_writes_nothing(
    postgres_dsn: str, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    ghost = EffectRequest(
        job_id=uuid4(), worker_id="w1", fence=1, idempotency_key="k", entity=ENTITY
    )
    with pytest.raises(UnknownJobError, match=r"job_id: no job .* in the lease store"):
        destination.apply(ghost, {})
    with pytest.raises(ValueError, match="fence"):
        EffectRequest(job_id=uuid4(), worker_id="w1", fence=-1, idempotency_key="k", entity="e")
    with pytest.raises(ValueError, match="entity"):
        EffectRequest(job_id=uuid4(), worker_id="w1", fence=1, idempotency_key="k", entity="a\n")
    assert [count(db, t) for t in ("fenced_entities", "fenced_receipts", "fenced_effects")] == [
        0,
        0,
        0,
    ]
    with connect(postgres_dsn) as conn:
        conn.execute("DROP TABLE fenced_effects, fenced_receipts, fenced_entities")
    with pytest.raises(NotMigratedError, match="run `splitbrain leases migrate`"):
        FencedDestination(postgres_dsn, NAME)


# -- the schema ----------------------------------------------------------------------------------


def test_migrate_adds_the_destination_to_a_version_1_store_once(empty_postgres_dsn: str) -> None:
    """A database migrated by the version before this one (step 1 only) gets the later steps,
    and step 1's SQL is unchanged (its recorded checksum still matches)."""
    one, *later = MIGRATIONS
    latest = later[-1].version
    with connect(empty_postgres_dsn) as conn:
        with conn.transaction():
            conn.execute(
                "CREATE TABLE splitbrain_migrations (version integer PRIMARY KEY, name text NOT"
                " NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute(one.sql)
            conn.execute(
                "INSERT INTO splitbrain_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (one.version, one.name, one.checksum),
            )
        first = migrate(conn)
        assert first.applied == tuple(later) and first.version == latest
        recorded = conn.execute(
            "SELECT version, name, checksum FROM splitbrain_migrations ORDER BY version"
        ).fetchall()
        assert [(r["version"], r["checksum"]) for r in recorded] == [
            (m.version, m.checksum) for m in MIGRATIONS
        ]
        second = migrate(conn)
        assert (second.applied, second.version) == ((), latest)
        assert (
            conn.execute(
                "SELECT version, name, checksum FROM splitbrain_migrations ORDER BY version"
            ).fetchall()
            == recorded
        )


# -- the order of a receipt ----------------------------------------------------------------------


def test_a_receipt_after_a_newer_claim_is_ordered_after_it(
    store: LeaseStore, destination: FencedDestination, db: psycopg.Connection[DictRow]
) -> None:
    """The displaced owner believes it still owns the job; its receipt takes the job's next seq
    under the job row's lock all the same, after the newer claim's."""
    w1, w2 = takeover(store, db)
    claims = [e for e in outbox(db, w1.job_id) if e["kind"] == "job_claimed"]
    assert [(c["fencing_token"], c["seq"]) for c in claims] == [(1, 1), (2, 2)]
    destination.apply(effect(w2, "invoice:42:capture"), {})
    store.extend(w2)
    stale = destination.apply(effect(w1, "invoice:42:refund"), {})
    assert not stale.accepted and stale.seq > claims[1]["seq"]
    event = last_event(db, w1.job_id)
    assert (event.kind, event.owner_epoch, event.seq) == (Kind.EFFECT_REJECTED, 1, stale.seq)
    # The events, read in any order, say the same: the refusal is after the takeover.
    events = outbox(db, w1.job_id)
    assert findings(db, w1.job_id) == {("stale_effect_rejected", 1)}
    early = [events[-1], *events[:-1]]
    result = audit_lines(json.dumps(e).encode() for e in early)
    assert len(result.findings) == 1


# -- the HTTP service -----------------------------------------------------------------------------


class Client:
    """POSTs to the service, one connection per request unless `keep` says otherwise."""

    def __init__(self, port: int) -> None:
        self.port = port

    def post(
        self,
        path: str,
        headers: dict[str, str],
        body: bytes | dict[str, Any] = b"{}",
        method: str = "POST",
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            return _exchange(conn, method, path, headers, body)
        finally:
            conn.close()


def _exchange(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | dict[str, Any],
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **headers})
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read())


def headers_of(lease: Lease, key: str, fence: int | None = None) -> dict[str, str]:
    return {
        "X-Execution-Fence": str(lease.fencing_token if fence is None else fence),
        "Idempotency-Key": key,
        "X-Execution-Job": str(lease.job_id),
        "X-Execution-Worker": lease.owner_id,
    }


def test_the_http_service_answers_each_request_with_its_status(
    postgres_dsn: str,
    store: LeaseStore,
    db: psycopg.Connection[DictRow],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    w1, w2 = takeover(store, db)
    secret = {"card": "4111-SECRET-1111"}
    with DestinationServer(postgres_dsn, NAME) as server:
        client = Client(server.port)
        path = f"/effects/{ENTITY}"

        status, body = client.post(path, headers_of(w2, "invoice:42:capture"), secret)
        assert (status, body["status"], body["fence"], body["fence_held"]) == (
            200,
            "accepted",
            2,
            2,
        )
        assert (body["entity"], body["job"], body["seq"]) == (ENTITY, str(w2.job_id), 3)
        assert body["result"] == {"effect_id": effects(db)[0]["id"]}
        status, again = client.post(path, headers_of(w2, "invoice:42:capture"), secret)
        assert (status, again["status"], again["seq"]) == (200, "repeated", 3)
        status, stale = client.post(path, headers_of(w1, "invoice:42:refund"), {"x": 1})
        assert (status, stale["status"], stale["decision"]) == (409, "rejected", "rejected")
        assert (stale["fence"], stale["fence_held"], stale["worker_id"]) == (1, 2, "w1")
        status, retried = client.post(path, headers_of(w1, "invoice:42:refund"), {"x": 1})
        assert (status, retried["status"], retried["decision"]) == (409, "repeated", "rejected")

        # The effect key defaults to the idempotency key; a header names another.
        named = {**headers_of(w2, "invoice:42:void"), "X-Effect-Key": "void:invoice-42"}
        status, body = client.post(path, named, {})
        assert (status, body["effect_key"], body["idempotency_key"]) == (
            200,
            "void:invoice-42",
            "invoice:42:void",
        )

    assert [e["payload"] for e in effects(db)] == [secret, {}]
    assert "SECRET" not in caplog.text and "4111" not in caplog.text
    assert "rejected destination=invoices job=" in caplog.text


def test_the_first_request_after_a_database_restart_is_answered(
    postgres: LocalPostgres, postgres_dsn: str, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    """The destination's idle sessions were ended by the restart: each is found closed before
    it is used, so the first request after it is decided, not answered 503."""
    _, w2 = takeover(store, db)
    with DestinationServer(postgres_dsn, NAME) as server:
        client = Client(server.port)
        path = f"/effects/{ENTITY}"
        status, _ = client.post(path, headers_of(w2, "invoice:42:capture"), {})
        assert status == 200
        postgres.restart()
        status, body = client.post(path, headers_of(w2, "invoice:42:void"), {})
        assert (status, body["status"]) == (200, "accepted")


def test_the_http_service_names_what_it_refuses(
    postgres_dsn: str, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    store.enqueue("ocr", "invoice:42:ocr", {})
    w1 = claimed(store.claim("ocr", "w1"))
    path = f"/effects/{ENTITY}"
    with DestinationServer(postgres_dsn, NAME) as server:
        client = Client(server.port)
        assert client.post(path, headers_of(w1, "invoice:42:capture"), {})[0] == 200
        good = headers_of(w1, "invoice:42:other")
        refusals: list[tuple[dict[str, str | None], str, str]] = [
            ({"X-Execution-Fence": None}, "X-Execution-Fence", "missing"),
            ({"X-Execution-Fence": "two"}, "X-Execution-Fence", "valid integer"),
            ({"X-Execution-Fence": "-1"}, "X-Execution-Fence", "greater than or equal to 0"),
            ({"X-Execution-Job": "job-42"}, "X-Execution-Job", "UUID"),
            ({"X-Execution-Worker": None}, "X-Execution-Worker", "missing"),
            ({"Idempotency-Key": "k" * 513}, "Idempotency-Key", "at most 512"),
            ({"X-Execution-Attempt": "0"}, "X-Execution-Attempt", "greater than or equal"),
        ]
        for change, field, reason in refusals:
            sent = {k: v for k, v in {**good, **change}.items() if v is not None}
            status, body = client.post(path, sent, {})
            assert (status, body["error"], body["field"]) == (400, "bad_request", field), change
            assert reason in body["reason"]
        status, body = client.post("/effects/a%0Ab", good, {})
        assert (status, body["field"], body["reason"]) == (
            400,
            "entity",
            "must not contain control characters",
        )
        status, body = client.post(path, good, b"[1, 2]")
        assert (status, body["field"]) == (400, "body")
        status, body = client.post(path, good, b"{not json")
        assert (status, body["field"]) == (400, "body")
        status, body = client.post(path, good, {"text": "x" * (16 * 1024)})
        assert (status, body["error"], body["field"]) == (413, "too_large", "body")

        ghost = {**good, "X-Execution-Job": str(uuid4())}
        status, body = client.post(path, ghost, {})
        assert (status, body["error"], body["field"]) == (404, "unknown_job", "X-Execution-Job")
        status, body = client.post("/payments/1", good, {})
        assert (status, body["error"]) == (404, "not_found")
        status, body = client.post(path, good, b"", method="GET")
        assert (status, body["error"]) == (405, "method_not_allowed")
        status, body = client.post("/effects/invoice-43", headers_of(w1, "invoice:42:capture"), {})
        assert (status, body["error"], body["field"]) == (
            422,
            "idempotency_key_reused",
            "Idempotency-Key",
        )

        # A refused request leaves its connection usable: its body was read.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            bad = {k: v for k, v in good.items() if k != "X-Execution-Fence"}
            assert _exchange(conn, "POST", path, bad, {"a": 1})[0] == 400
            status, body = _exchange(conn, "POST", path, good, {"a": 1})
            assert (status, body["status"]) == (200, "accepted")
        finally:
            conn.close()

    assert [e["payload"] for e in effects(db)] == [{}, {"a": 1}]


def test_the_command_serves_until_sigterm_and_refuses_a_missing_dsn(
    postgres_dsn: str, store: LeaseStore, db: psycopg.Connection[DictRow]
) -> None:
    w1, w2 = takeover(store, db)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SPLITBRAIN_")}
    command = [sys.executable, "-m", "detector.cli", "leases", "destination"]
    missing = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert (missing.returncode, missing.stdout) == (ExitCode.UNUSABLE, "")
    assert "no database given: pass --dsn or set SPLITBRAIN_LEASES_DSN" in missing.stderr

    service = subprocess.Popen(
        [*command, "--port", "0", "--unfenced", "--name", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "SPLITBRAIN_LEASES_DSN": postgres_dsn},
    )
    try:
        assert service.stdout is not None
        line = service.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:") and "UNFENCED" in line
        port = int(line.split()[2].rsplit(":", 1)[1])
        client = Client(port)
        status, body = client.post(f"/effects/{ENTITY}", headers_of(w2, "invoice:42:a"), {})
        assert (status, body["destination"]) == (200, "demo")
        status, body = client.post(f"/effects/{ENTITY}", headers_of(w1, "invoice:42:b"), {})
        assert (status, body["status"], body["fence"], body["fence_held"]) == (
            200,
            "accepted",
            1,
            2,
        )
    finally:
        service.send_signal(signal.SIGTERM)
        _, err = service.communicate(timeout=30)
    assert service.returncode == ExitCode.OK, err
    assert last_event(db, w1.job_id).kind is Kind.EFFECT_COMMITTED
