"""The fenced destination: where an effect is refused unless its fence is the newest seen.

A lease cannot stop a displaced owner that does not know it lost (a GC pause, a partition, a
hung call that returns late): only the destination can, by comparing the fencing token with the
write, atomically (DESIGN §1). `FencedDestination` does that for effects kept in PostgreSQL:

- Per entity (an invoice id, a document id) it keeps the highest fence it accepted. A request
  presenting a lower fence is **rejected** with a receipt saying what was refused, the fence
  presented and the fence held; an equal fence is accepted (one owner may make several effects
  on one entity), a higher one is accepted and becomes the fence held.
- Per job it reads the current token from the job row it locks anyway: a fence below it is a
  displaced owner's and is **rejected** too, even on an entity its successor has not written to
  yet (the event's `detail.refused_below` says which fence refused it: `entity` or `job`).
- Per idempotency key it makes at most one effect. The same key again, at a fence no lower than
  the accepted one's, gets the stored receipt back, **repeated**, and makes no second effect and
  no second event; at a lower fence it is a stale owner's, and is rejected like any other (it
  is not handed its successor's receipt, which would read as its own success). A rejection
  does not use the key up: the owner that displaced the rejected one sends the same key (a
  job's key names its operation, not an attempt) and must be able to make the effect. A
  repeat of a rejected request that presents no higher fence than it did gets the stored
  rejection back. A repeat under a higher fence than the accepted one's raises the entity's
  fence to it, as an accepted request would: the older owner cannot then commit another key
  on that entity.
- Every decision publishes an ownership event with `source: "destination"`: `effect_committed`
  or `effect_rejected`, under the fence the request **presented** (not the job's current token),
  with the request's effect key.
- The effect, its receipt and its event are written in **one transaction** of the destination's
  database: there is never an effect without its receipt and event, nor a receipt of an effect
  that did not happen.
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
destination in another database could not take a seq in the job's order: its events would be
ordered by their arrival in the partition only, which is weaker (a late-delivered receipt from
before the takeover would look stale). That is not built here.

The entity's fence alone would protect it only from owners older than the newest one that wrote
to it; the job's token closes the window between a takeover and the new owner's first write.
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
from detector.leases.errors import LeaseInputError, StoreUnavailableError
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
    `fence` is what that request presented, `fence_held` the entity's fence after the decision,
    `seq` the position of its event in the job's order."""

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
# The receipt a request repeats. Fenced: the key's accepted one, if its fence is not above the
# one presented now (a stale owner is refused, not handed its successor's receipt); else a
# refusal at a fence at least the one presented now (which would be refused again), the
# closest first. Unfenced: only a request of the same key and fence (one owner's retry).
_STORED: Final = f"""
SELECT {_RECEIPT_COLUMNS} FROM fenced_receipts
 WHERE destination = %(destination)s AND idempotency_key = %(idempotency_key)s
   AND CASE WHEN %(fenced)s
            THEN (accepted AND fence <= %(fence)s) OR (NOT accepted AND fence >= %(fence)s)
            ELSE fence = %(fence)s END
 ORDER BY accepted DESC, fence
 LIMIT 1
"""
_ENTITY_NEW: Final = """
INSERT INTO fenced_entities (destination, entity, fence)
VALUES (%(destination)s, %(entity)s, %(fence)s)
ON CONFLICT (destination, entity) DO NOTHING
"""
_ENTITY_LOCK: Final = """
SELECT fence FROM fenced_entities
 WHERE destination = %(destination)s AND entity = %(entity)s
   FOR UPDATE
"""
_ENTITY_HOLD: Final = """
UPDATE fenced_entities SET fence = %(fence_held)s, updated_at = now()
 WHERE destination = %(destination)s AND entity = %(entity)s
"""
# A repeat under a higher fence proves that fence's owner exists: no lower one may write now.
_ENTITY_RAISE: Final = """
UPDATE fenced_entities SET fence = %(fence)s, updated_at = now()
 WHERE destination = %(destination)s AND entity = %(entity)s AND fence < %(fence)s
"""
# Takes the key (or waits for the transaction that holds it, and then takes nothing).
_RECEIPT: Final = f"""
INSERT INTO fenced_receipts ({_RECEIPT_COLUMNS}, fenced)
VALUES (%(destination)s, %(idempotency_key)s, %(fence)s, %(accepted)s, %(entity)s,
        %(effect_key)s, %(job_id)s, %(worker_id)s, %(fence_held)s, %(seq)s, NULL, now(),
        %(fenced)s)
ON CONFLICT DO NOTHING
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
    def __init__(self, stored: DictRow | None) -> None:
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
        accepted, rejected (a lower fence than the entity's), or the stored receipt of the key
        (`repeated`). An exception from the effect rolls everything back and is raised.

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
            stored = repeat.stored
            if stored is None:  # another transaction took the key while this one waited
                with self._db.transaction() as conn:
                    stored = conn.execute(_STORED, params).fetchone()
                if stored is None:
                    raise StoreUnavailableError(
                        "the idempotency key's receipt vanished: retry the request"
                    ) from None
            receipt = _receipt(stored, repeated=True)
            if (receipt.entity, receipt.effect_key) != (request.entity, request.key):
                raise IdempotencyKeyReusedError(receipt) from None
            if self.fenced and receipt.accepted and request.fence > receipt.fence:
                with self._db.transaction() as conn:
                    conn.execute(_ENTITY_RAISE, params)
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
            # A repeat is answered without taking a lock or a seq.
            stored = conn.execute(_STORED, params).fetchone()
            if stored is not None:
                raise _Repeated(stored)
            # The job's row, then the entity's: every destination call locks in that order.
            job = next_seq(conn, request.job_id)
            if job is None:
                raise UnknownJobError(request.job_id)
            conn.execute(_ENTITY_NEW, params)
            locked = conn.execute(_ENTITY_LOCK, params).fetchone()
            assert locked is not None  # inserted or there, and never deleted
            held: int = locked["fence"]
            # Under the entity's lock, a receipt committed while this one waited is visible.
            stored = conn.execute(_STORED, params).fetchone()
            if stored is not None:
                raise _Repeated(stored)
            # Below the job's current token is a displaced owner's, even on an entity its
            # successor has not written to yet.
            token: int = job["fencing_token"]
            below = "entity" if request.fence < held else "job" if request.fence < token else None
            accepted = not self.fenced or below is None
            fence_held = max(held, request.fence) if accepted else held
            seq: int = job["event_seq"]
            mine = {**params, "accepted": accepted, "fence_held": fence_held, "seq": seq}
            taken = conn.execute(_RECEIPT, mine).fetchone()
            if taken is None:
                raise _Repeated(None)
            result = None
            if accepted:
                result = run(conn)
                text = json_text("result", result, self._max_payload_bytes)
                result = json.loads(text)  # as it is stored, and as a repeat returns it
                conn.execute(_RESULT, {**params, "result": text})
                if fence_held != held:
                    conn.execute(_ENTITY_HOLD, mine)
            attempt = request.attempt
            current = (job["owner_id"], job["fencing_token"])
            if attempt is None and current == (request.worker_id, request.fence):
                attempt = job["attempt"]
            detail: dict[str, Any] = {
                "entity": request.entity,
                "idempotency_key": request.idempotency_key,
                "fence_held": fence_held,
                "fenced": self.fenced,
            }
            if not accepted:
                detail["refused_below"] = below  # the entity's fence, or the job's token
                detail["job_fence"] = token
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
            fence_held=fence_held,
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
