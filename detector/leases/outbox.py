"""A job's ownership events, appended to `tool_job_outbox` in the transaction that makes them.

The authoritative order of a job's events is the job row's `event_seq`: every event takes the
next value in the transaction that writes it, while that transaction holds the row locked. A
takeover (a claim) takes its seq the same way, so whatever a displaced owner records after it is
ordered after it, whatever the owner believes; and an event recorded before it keeps its lower
seq however late the relay publishes it. Nothing here picks a seq on its own: that is the point.

Whoever writes an event of a job — the store on a transition or a refusal, a fenced destination
in the same database on a receipt — does it through `append`, which validates the event against
the input contract (DESIGN §3) before it writes the row: an event the detector could not read
raises at its caller, in the transaction that would have written it, and never reaches the relay.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final, Literal
from uuid import UUID

import psycopg
from psycopg.rows import DictRow

from detector.contracts.events import EventError, Source, parse_event_strict
from detector.leases.errors import LeaseInputError
from detector.leases.policy import Labels

# The job-queue kinds of DESIGN §3 (and the two a destination writes) that reach the outbox.
EventKind = Literal[
    "job_claimed",
    "heartbeat_ok",
    "heartbeat_lost",
    "tool_request_started",
    "result_rejected",
    "lease_released",
    "effect_committed",
    "effect_rejected",
]


def event_columns(table: str = "") -> str:
    """What an event of a transition needs from the job row, `at` being the database's now()."""
    names = (
        "id",
        "job_class",
        "state",
        "owner_id",
        "fencing_token",
        "attempt",
        "lease_until",
        "event_seq",
        "tool_class",
        "model",
        "provider",
    )
    return ", ".join(f"{table}{name}" for name in names) + ", now() AS at"


# An event that changes nothing of the job (a refusal, a request, a receipt) still takes a seq.
_NEXT_SEQ: Final = f"""
UPDATE tool_jobs SET event_seq = event_seq + 1 WHERE id = %(job_id)s RETURNING {event_columns()}
"""
_APPEND: Final = "INSERT INTO tool_job_outbox (job_id, seq, event) VALUES (%s, %s, %s::jsonb)"


def next_seq(conn: psycopg.Connection[DictRow], job_id: UUID) -> DictRow | None:
    """Take the job's next seq (locking its row until the transaction ends); None if no job."""
    return conn.execute(_NEXT_SEQ, {"job_id": job_id}).fetchone()


def row_labels(row: DictRow) -> Labels:
    return Labels(tool_class=row["tool_class"], model=row["model"], provider=row["provider"])


def append(
    conn: psycopg.Connection[DictRow],
    row: DictRow,
    kind: EventKind,
    *,
    owner: tuple[str, int, int] | None = None,
    source: Source = Source.WORKER,
    detail: dict[str, Any] | None = None,
    **fields: Any,
) -> None:
    """Append the job's event `kind` at the seq its row just took (`row` holds the columns of
    `event_columns`). The event is `owner`'s (owner id, token, attempt), else the row's owner's.
    `LeaseInputError` naming the field when the event would not be valid: raised before the
    row is written, it rolls back the caller's transaction."""
    owner_id, token, attempt = (
        (row["owner_id"], row["fencing_token"], row["attempt"]) if owner is None else owner
    )
    event: dict[str, Any] = {
        "event_id": f"{row['id']}:{row['event_seq']}",
        "kind": kind,
        "job": str(row["id"]),
        "fencing_token": token,
        "owner_id": owner_id,
        "seq": row["event_seq"],
        "source": source,
        "observed_at": row["at"].isoformat(),
        "detail": {"job_class": row["job_class"], "attempt": attempt, **(detail or {})},
    }
    for name, value in fields.items():
        if value is not None:
            event[name] = value.isoformat() if isinstance(value, datetime) else value
    attrs = row_labels(row).attrs()
    if attrs:
        event["attrs"] = attrs
    try:
        parse_event_strict(event)
    except EventError as exc:
        raise LeaseInputError(
            exc.field or "event", f"the {kind} event would not be valid: {exc.reason}"
        ) from None
    conn.execute(_APPEND, (row["id"], row["event_seq"], json.dumps(event)))
