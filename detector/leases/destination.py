"""The fenced destination: where an effect is refused unless its fence is its job's current token.

A lease cannot stop a displaced owner that does not know it lost (a GC pause, a partition, a
hung call that returns late): only the destination can, by comparing the fencing token with the
write, atomically (DESIGN §1). `FencedDestination` does that for effects kept in PostgreSQL:

- Per job, it compares the fence presented with the one the store issued: the job's current
  token, read from the job's row, which it locks in the transaction that writes the effect (a
  claim or a cancel that would change the token waits for it, or it for them). The fence must
  be **equal** to the token, and the job `running`; anything else is **rejected** with a
  receipt saying what was refused, the fence presented and the job's token (`fence_held`), and
  the event's `detail.refused` says why: `stale` (below the token: a displaced owner's),
  `unissued` (above it: no owner of the job holds it, whatever the request claims) or
  `not_running` (the token, but the job was retried, finished or cancelled). A fence is never
  compared with another job's: two jobs on one entity (stages of one invoice, a re-enqueued
  job, a refund after a capture) each write under their own token, whichever is higher.
- Per idempotency key it makes at most one effect, whichever job presents the key. The same
  key again gets the stored receipt back, **repeated**, and makes no second effect and no
  second event, when it comes from the current owner of its job, or is a retry of the accepted
  request itself (same job, same fence: that effect did land). Anyone else presenting the key
  is refused like any other request under a wrong fence, and is not handed the accepted
  receipt, which would read as its own success. A rejection does not use the key up: the owner
  that displaced the rejected one sends the same key (a job's key names its operation, not an
  attempt) and must be able to make the effect. A repeat of a rejected request (same key, same
  fence) that would be refused again gets the stored rejection back; one whose fence the store
  has issued since (an unissued fence the job's claims then reached) is decided again.
- Every decision publishes an ownership event with `source: "destination"`: `effect_committed`
  or `effect_rejected`, under the fence the request **presented** (not the job's current token),
  with the request's effect key.
- The effect, its receipt and its event are written in **one transaction** of the destination's
  database: there is never an effect without its receipt and event, nor a receipt of an effect
  that did not happen. The requests of one key are decided one after another (under a lock of
  the key), so two of them never both make the effect.
- `fenced=False` is the unfenced mode (the demo's "before", and tests): a destination as most
  are, which enforces neither the fence nor the key across owners. Every fence is accepted, and
  only a retry of the same key under the same fence is answered from its receipt; a displaced
  owner's request makes the effect a second time. The receipt and the event record the fence
  presented, so that effect shows up as an `effect_committed` at its stale epoch, and the
  detector finds the stale commit and the failover duplicate.

Ordering. The destination lives in the lease store's database, and its events go to the job's
outbox (`tool_job_outbox`, published by the relay) with the job's next `seq`, taken under the
job row's lock in the receipt's transaction (`detector.leases.outbox`). So a receipt given after
a takeover is ordered after the takeover's `job_claimed`, whatever the displaced owner
believes, and the detector's verdict on it is authoritative (`ordering: authoritative_seq`). A
request must therefore name a job that exists: an unknown job is an error, not a guess. A
destination in another database could not take a seq in the job's order, nor read the job's
token in its own transaction: its events would be ordered by their arrival in the partition
only, which is weaker (a late-delivered receipt from before the takeover would look stale). That
is not built here.

Entities. `fenced_entities` keeps one row per entity (the receipts refer to it) with the highest
fence accepted on it, as a record: no decision reads it. An earlier version refused a fence
below that entity fence, which refused a second job's current owner whenever another job on the
entity had reached a higher token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal
from uuid import UUID

import psycopg
from psycopg.rows import DictRow
from pydantic import BaseModel, ConfigDict, Field

from detector.closing import Closing
from detector.contracts.events import (
    MAX_DESTINATION_CHARS,
    MAX_EPOCH,
    MAX_KEY_CHARS,
    MAX_WORKER_ID_CHARS,
    Source,
)
from detector.leases.db import Database
from detector.leases.errors import LeaseInputError
from detector.leases.inspect import NotMigratedError
from detector.leases.outbox import append, next_seq
from detector.leases.values import MAX_PAYLOAD_BYTES, check_text, digest, json_text

log = logging.getLogger(__name__)

MAX_ENTITY_CHARS: Final = 256  # the destination's own limit (`fenced_entities.entity`)
# No control characters: these go into logs and events as they are.
_PRINTABLE: Final = r"^[^\x00-\x1f\x7f]+$"


def _text(limit: int) -> Any:
    return Field(min_length=1, max_length=limit, pattern=_PRINTABLE)


class EffectRequest(BaseModel):
    """What a caller presents with an effect. `effect_key`, if omitted, is the idempotency key
    (`key` gives the one in force); `attempt`, if omitted, is the job's when the fence and
    worker are its current owner's, and is recorded as unknown (null) otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: UUID
    worker_id: Annotated[str, _text(MAX_WORKER_ID_CHARS)]
    fence: Annotated[int, Field(ge=0, le=MAX_EPOCH)]
    idempotency_key: Annotated[str, _text(MAX_KEY_CHARS)]
    entity: Annotated[str, _text(MAX_ENTITY_CHARS)]
    effect_key: Annotated[str | None, _text(MAX_KEY_CHARS)] = None
    attempt: Annotated[int | None, Field(ge=1, le=2**31 - 1)] = None

    @property
    def key(self) -> str:
        """The effect key, the idempotency key's when none was given."""
        return self.effect_key or self.idempotency_key


class Decision(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Receipt:
    """A destination's decision on one request, as stored. `repeated` says this answer is the
    stored receipt of an earlier request with the same idempotency key (nothing was done now);
    `fence` is what that request presented, `fence_held` the job's token it was compared with
    (what the store had issued for the job then), `seq` the position of its event in the job's
    order."""

    destination: str
    decision: Decision
    repeated: bool
    job_id: UUID
    worker_id: str
    entity: str
    effect_key: str
    idempotency_key: str
    fence: int
    fence_held: int
    seq: int
    result: Any
    created_at: datetime

    @property
    def accepted(self) -> bool:
        return self.decision is Decision.ACCEPTED

    @property
    def status(self) -> Literal["accepted", "rejected", "repeated"]:
        return "repeated" if self.repeated else self.decision.value

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "decision": self.decision.value,
            "repeated": self.repeated,
            "destination": self.destination,
            "entity": self.entity,
            "effect_key": self.effect_key,
            "idempotency_key": self.idempotency_key,
            "job": str(self.job_id),
            "worker_id": self.worker_id,
            "fence": self.fence,
            "fence_held": self.fence_held,
            "seq": self.seq,
            "result": self.result,
            "created_at": self.created_at.isoformat(),
        }


class UnknownJobError(LeaseInputError):
    """The request names no job of the lease store: its receipt could not be ordered."""

    def __init__(self, job_id: UUID) -> None:
        super().__init__("job_id", f"no job {job_id} in the lease store")
        self.job_id = job_id


class IdempotencyKeyReusedError(LeaseInputError):
    """The idempotency key already names an effect on another entity or under another effect
    key: the key names one operation, and this request is a different one."""

    def __init__(self, stored: Receipt) -> None:
        super().__init__(
            "idempotency_key",
            f"already used for entity {stored.entity!r}, effect key {stored.effect_key!r}",
        )
        self.stored = stored


Effect = Callable[[psycopg.Connection[DictRow]], Any]
"""An effect: run on the destination's connection inside the receipt's transaction, it writes
through that connection only, and returns its result (JSON), which the receipt keeps."""

_RECEIPT_COLUMNS: Final = (
    "destination, idempotency_key, fence, accepted, entity, effect_key, job_id, worker_id,"
    " fence_held, seq, result, created_at"
)
# Every request of one idempotency key is decided under this lock, one after another: a receipt
# committed while a request waited is visible to it. (Two-key advisory locks; 0x4644 is this
# destination's space, the relays' is 0x5B1A and the LangGraph ledger's 0x4C47.)
_KEY_LOCK: Final = """
SELECT pg_advisory_xact_lock(17988, hashtext(%(destination)s || chr(1) || %(idempotency_key)s))
"""
# The receipts of the key, the accepted one (at most one when fenced) first.
_STORED: Final = f"""
SELECT {_RECEIPT_COLUMNS}, fenced FROM fenced_receipts
 WHERE destination = %(destination)s AND idempotency_key = %(idempotency_key)s
 ORDER BY accepted DESC, fenced DESC, created_at
"""
# The entity's row: what receipts refer to, and a record of the highest fence accepted on it.
# No decision reads that fence: fences are compared per job, with the job's token.
_ENTITY_NEW: Final = """
INSERT INTO fenced_entities (destination, entity, fence)
VALUES (%(destination)s, %(entity)s, 0)
ON CONFLICT (destination, entity) DO NOTHING
"""
_ENTITY_RECORD: Final = """
UPDATE fenced_entities SET fence = %(fence)s, updated_at = now()
 WHERE destination = %(destination)s AND entity = %(entity)s AND fence < %(fence)s
"""
# A refusal at a fence that the store has issued since (an unissued fence, then reached by the
# job's claims) gives way to the acceptance: the refusal's event stays in the job's outbox.
_RECEIPT: Final = f"""
INSERT INTO fenced_receipts ({_RECEIPT_COLUMNS}, fenced)
VALUES (%(destination)s, %(idempotency_key)s, %(fence)s, %(accepted)s, %(entity)s,
        %(effect_key)s, %(job_id)s, %(worker_id)s, %(fence_held)s, %(seq)s, NULL, now(),
        %(fenced)s)
ON CONFLICT (destination, idempotency_key, fence) DO UPDATE
   SET accepted = EXCLUDED.accepted, job_id = EXCLUDED.job_id, worker_id = EXCLUDED.worker_id,
       fence_held = EXCLUDED.fence_held, seq = EXCLUDED.seq, result = NULL,
       fenced = EXCLUDED.fenced, created_at = EXCLUDED.created_at
 WHERE EXCLUDED.accepted AND NOT fenced_receipts.accepted
RETURNING created_at
"""
_RESULT: Final = """
UPDATE fenced_receipts SET result = %(result)s::jsonb
 WHERE destination = %(destination)s AND idempotency_key = %(idempotency_key)s
   AND fence = %(fence)s
"""
_LEDGER: Final = """
INSERT INTO fenced_effects (destination, entity, idempotency_key, fence, payload)
VALUES (%(destination)s, %(entity)s, %(idempotency_key)s, %(fence)s, %(payload)s::jsonb)
RETURNING id
"""
_MIGRATED: Final = "SELECT to_regclass('fenced_receipts') IS NOT NULL AS migrated"


class _Repeated(Exception):  # noqa: N818 - control flow: roll back, answer with the stored one
    def __init__(self, stored: DictRow) -> None:
        super().__init__()
        self.stored = stored


class FencedDestination(Closing):
    """The destination `name` in the lease store's database at `dsn` (migrated by `splitbrain
    leases migrate`). One connection: use one destination object per thread. A broken
    connection is replaced on the next call."""

    def __init__(
        self,
        dsn: str,
        name: str,
        *,
        fenced: bool = True,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        check_text("name", name, MAX_DESTINATION_CHARS)
        self.name = name
        self.fenced = fenced
        self._max_payload_bytes = max_payload_bytes
        self._db = Database(dsn, "the destination's database")
        try:
            with self._db.transaction() as conn:
                row = conn.execute(_MIGRATED).fetchone()
        except BaseException:
            self._db.close()
            raise
        if row is None or not row["migrated"]:
            self._db.close()
            raise NotMigratedError(
                "the database has no fenced destination tables (fenced_receipts): run "
                "`splitbrain leases migrate` with the same DSN first"
            )

    def close(self) -> None:
        self._db.close()

    def apply(self, request: EffectRequest, effect: Effect | Mapping[str, Any]) -> Receipt:
        """Decide on `request` and, if it is accepted, make `effect`, in one transaction.

        `effect` is a callable (see `Effect`), or a JSON object: the payload, then recorded as
        one row of `fenced_effects` (the result is its `effect_id`). The answer is the receipt:
        accepted, rejected (not the job's current token, or the job not running), or the
        stored receipt of the key (`repeated`). An exception from the effect rolls everything
        back and is raised.

        `UnknownJobError`: no such job. `IdempotencyKeyReusedError`: the key names another
        operation. `LeaseInputError`: a payload or result that is not JSON or is too large.
        `StoreUnavailableError`: no answer, so whether it committed is unknown; sending the
        same request again is safe (that is what the idempotency key is for).
        """
        if callable(effect):
            run, payload_sha256 = effect, None
        else:
            body = json_text("payload", dict(effect), self._max_payload_bytes)
            run, payload_sha256 = self._ledger(request, body), digest(body)
        params = {
            "destination": self.name,
            "idempotency_key": request.idempotency_key,
            "fence": request.fence,
            "entity": request.entity,
            "effect_key": request.key,
            "job_id": request.job_id,
            "worker_id": request.worker_id,
            "fenced": self.fenced,
        }
        try:
            receipt = self._decide(request, params, run, payload_sha256)
        except _Repeated as repeat:
            receipt = _receipt(repeat.stored, repeated=True)
        log.log(
            logging.INFO if receipt.accepted else logging.WARNING,
            "%s destination=%s job=%s seq=%d entity=%s key_sha256=%s fence=%d held=%d"
            " presented=%d worker=%s%s",
            receipt.status,
            self.name,
            receipt.job_id,
            receipt.seq,
            receipt.entity,
            digest(request.idempotency_key),
            receipt.fence,
            receipt.fence_held,
            request.fence,
            request.worker_id,
            "" if payload_sha256 is None else f" payload_sha256={payload_sha256}",
        )
        return receipt

    # -- internals --------------------------------------------------------------------------

    def _decide(
        self,
        request: EffectRequest,
        params: dict[str, Any],
        run: Effect,
        payload_sha256: str | None,
    ) -> Receipt:
        with self._db.transaction() as conn:
            # The job's row (locked, and its next seq taken: a repeat rolls both back), then the
            # key's lock: every destination call takes them in that order.
            job = next_seq(conn, request.job_id)
            if job is None:
                raise UnknownJobError(request.job_id)
            conn.execute(_KEY_LOCK, params)
            stored = conn.execute(_STORED, params).fetchall()
            if stored and (stored[0]["entity"], stored[0]["effect_key"]) != (
                request.entity,
                request.key,
            ):
                raise IdempotencyKeyReusedError(_receipt(stored[0], repeated=True))
            token: int = job["fencing_token"]
            # What the store issued for this job, under its row's lock: a claim or a cancel
            # that would change it waits for this transaction, or this one for it.
            refused = _refusal(job, request.fence) if self.fenced else None
            same = next((r for r in stored if r["fence"] == request.fence), None)
            if self.fenced:
                done = next((r for r in stored if r["accepted"]), None)
                if done is not None and (
                    refused is None  # the job's current owner: the effect was made once
                    or (done["job_id"], done["fence"]) == (request.job_id, request.fence)
                ):
                    raise _Repeated(done)
                if same is not None and (refused is not None or same["accepted"]):
                    if refused is not None and same["accepted"]:
                        # Another job made this key's effect under this very fence.
                        raise IdempotencyKeyReusedError(_receipt(same, repeated=True))
                    raise _Repeated(same)  # refused again: the stored refusal
            elif same is not None:
                raise _Repeated(same)  # one owner's retry: same key, same fence
            accepted = refused is None
            conn.execute(_ENTITY_NEW, params)
            seq: int = job["event_seq"]
            mine = {**params, "accepted": accepted, "fence_held": token, "seq": seq}
            taken = conn.execute(_RECEIPT, mine).fetchone()
            assert taken is not None  # under the key's lock, every conflict was seen above
            result = None
            if accepted:
                result = run(conn)
                text = json_text("result", result, self._max_payload_bytes)
                result = json.loads(text)  # as it is stored, and as a repeat returns it
                conn.execute(_RESULT, {**params, "result": text})
                conn.execute(_ENTITY_RECORD, params)
            attempt = request.attempt
            current = (job["owner_id"], job["fencing_token"])
            if attempt is None and current == (request.worker_id, request.fence):
                attempt = job["attempt"]
            detail: dict[str, Any] = {
                "entity": request.entity,
                "idempotency_key": request.idempotency_key,
                "fence_held": token,
                "fenced": self.fenced,
            }
            if refused is not None:
                detail["refused"] = refused.value
                detail["job_fence"] = token
                detail["job_state"] = job["state"]
            if attempt is None:
                detail["attempt"] = None  # a displaced owner's attempt is not the job's
            if payload_sha256 is not None:
                detail["payload_sha256"] = payload_sha256
            append(
                conn,
                job,
                "effect_committed" if accepted else "effect_rejected",
                owner=(request.worker_id, request.fence, 0 if attempt is None else attempt),
                source=Source.DESTINATION,
                detail=detail,
                effect_key=request.key,
                destination=self.name,
            )
        return Receipt(
            destination=self.name,
            decision=Decision.ACCEPTED if accepted else Decision.REJECTED,
            repeated=False,
            job_id=request.job_id,
            worker_id=request.worker_id,
            entity=request.entity,
            effect_key=request.key,
            idempotency_key=request.idempotency_key,
            fence=request.fence,
            fence_held=token,
            seq=seq,
            result=result,
            created_at=taken["created_at"],
        )

    def _ledger(self, request: EffectRequest, body: str) -> Effect:
        def record(conn: psycopg.Connection[DictRow]) -> Any:
            row = conn.execute(
                _LEDGER,
                {
                    "destination": self.name,
                    "entity": request.entity,
                    "idempotency_key": request.idempotency_key,
                    "fence": request.fence,
                    "payload": body,
                },
            ).fetchone()
            assert row is not None
            return {"effect_id": row["id"]}

        return record


class Refusal(StrEnum):
    """Why a fenced destination refused a fence: it is not the job's current token."""

    STALE = "stale"  # below the job's token: a displaced owner's
    UNISSUED = "unissued"  # above it: a fence the store has not issued for this job
    NOT_RUNNING = "not_running"  # the token, but the job is not running (retried, finished)


def _refusal(job: DictRow, fence: int) -> Refusal | None:
    """None when `fence` is the job's current token and the job is running: its owner's."""
    token: int = job["fencing_token"]
    if fence < token:
        return Refusal.STALE
    if fence > token:
        return Refusal.UNISSUED
    return None if job["state"] == "running" else Refusal.NOT_RUNNING


def _receipt(row: DictRow, *, repeated: bool) -> Receipt:
    return Receipt(
        destination=row["destination"],
        decision=Decision.ACCEPTED if row["accepted"] else Decision.REJECTED,
        repeated=repeated,
        job_id=row["job_id"],
        worker_id=row["worker_id"],
        entity=row["entity"],
        effect_key=row["effect_key"],
        idempotency_key=row["idempotency_key"],
        fence=row["fence"],
        fence_held=row["fence_held"],
        seq=row["seq"],
        result=row["result"],
        created_at=row["created_at"],
    )
