"""Connections to the lease store's database (psycopg 3, synchronous)."""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row

from detector.leases.errors import StoreUnavailableError

# libpq waits for a connection forever unless told; a DSN that says otherwise wins.
_DEFAULTS: Final = {"connect_timeout": "10", "application_name": "splitbrain-leases"}


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
