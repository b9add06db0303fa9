"""Connections to the lease store's database (psycopg 3, synchronous)."""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row

from detector.leases.errors import StoreUnavailableError

# libpq waits forever unless told: for a connection, for an answer on a network that went
# silent (no RST, as in a partition), for a statement behind a lock. Each is bounded, so that a
# worker learns "the store did not answer" in seconds and can say ownership is uncertain. A DSN
# that sets one of these wins.
_DEFAULTS: Final = {
    "connect_timeout": "10",
    "application_name": "splitbrain-leases",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",  # ms: unacknowledged data is given up on after this
    "options": "-c statement_timeout=10000 -c idle_in_transaction_session_timeout=60000",
}


def one_line(exc: BaseException) -> str:
    """libpq's messages span lines (`connection refused` and then a hint): one line to print."""
    return " ".join(str(exc).split())


def connect(dsn: str) -> psycopg.Connection[DictRow]:
    """A connection in autocommit mode, so that each store call's `transaction()` is exactly one
    database transaction, with rows as dicts. libpq also reads PGPASSWORD and ~/.pgpass, which
    keep a password out of the DSN."""
    given = conninfo_to_dict(dsn)
    conninfo = make_conninfo(dsn, **{k: v for k, v in _DEFAULTS.items() if k not in given})
    try:
        return psycopg.connect(conninfo, autocommit=True, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(f"cannot connect to the lease store: {one_line(exc)}") from exc
