"""Connections to the lease store's database (psycopg 3, synchronous), and `Database`: the one
connection of a store, a destination or a relay, with its transactions."""

from __future__ import annotations

import contextlib
import os
import re
import select
from collections.abc import Iterator, Mapping
from typing import Final

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
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
}
# The server's side of the same bounds, sent in the startup packet's `options`: added to a DSN's
# own `options` (which would otherwise replace them, silently), unless it sets them itself.
SERVER_SETTINGS: Final = {
    "statement_timeout": "10000",  # ms
    "idle_in_transaction_session_timeout": "60000",  # ms
    # Every statement of the store is a parameterised lookup on an index whose plan does not
    # depend on the values. psycopg prepares a statement on its fifth run, but PostgreSQL goes on
    # planning it anew whenever it estimates the generic plan costlier (the claim's CTEs): that
    # planning took 1.6 ms of a 2.8 ms claim (bench/bench_leases.py). Plan once.
    "plan_cache_mode": "force_generic_plan",
}
# `-c name=value`, `-cname=value` or `--name=value` (dashes in a name stand for underscores).
_SETTING: Final = re.compile(r"(?:^|\s)(?:-c\s*|--)([A-Za-z0-9_.-]+)=")


def one_line(exc: BaseException) -> str:
    """libpq's messages span lines (`connection refused` and then a hint): one line to print."""
    return " ".join(str(exc).split())


def connect(dsn: str, settings: Mapping[str, str] | None = None) -> psycopg.Connection[DictRow]:
    """A connection in autocommit mode, so that each store call's `transaction()` is exactly one
    database transaction, with rows as dicts; `settings` replace `SERVER_SETTINGS`' values.
    libpq also reads PGPASSWORD and ~/.pgpass, which keep a password out of the DSN."""
    given = conninfo_to_dict(dsn)
    extra = {k: v for k, v in _DEFAULTS.items() if k not in given}
    options = given.get("options")
    extra["options"] = with_server_settings(
        None if options is None else str(options), {**SERVER_SETTINGS, **(settings or {})}
    )
    conninfo = make_conninfo(dsn, **extra)
    try:
        return psycopg.connect(conninfo, autocommit=True, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(f"cannot connect to the lease store: {one_line(exc)}") from exc


def with_server_settings(options: str | None, settings: Mapping[str, str] = SERVER_SETTINGS) -> str:
    """A DSN's `options` with the server-side `settings` it does not set itself appended."""
    own = {name.replace("-", "_") for name in _SETTING.findall(options or "")}
    added = [f"-c {name}={value}" for name, value in settings.items() if name not in own]
    return " ".join(part for part in (options or "", *added) if part)


def _closed_by_server(conn: psycopg.Connection[DictRow]) -> bool:
    """An idle session has nothing to read unless the server ended it (a restart, an
    administrator's `pg_terminate_backend`, an idle timeout): then its socket holds the
    server's goodbye or its end. Found before use, it costs the caller nothing; found by the
    caller's first statement, it would be a failed request after every database restart."""
    if conn.info.transaction_status is not TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):  # no socket any more
        return True
    return bool(readable)


class Database:
    """One connection to the database at `dsn`, made on first use and made again when it broke
    or when this process is a fork of the one that made it (a socket shared by two processes
    interleaves both's statements). For one thread: a blocking connection per thread is what
    lets a heartbeat go on while a tool call blocks another thread. `name` says whose database
    it is in errors."""

    def __init__(
        self,
        dsn: str,
        name: str = "the lease store",
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self._dsn = dsn
        self._settings = settings
        self._conn: psycopg.Connection[DictRow] | None = None
        self._pid = os.getpid()

    def connection(self) -> psycopg.Connection[DictRow]:
        """The connection, a new one if there was none or it broke (`StoreUnavailableError`
        when the database does not answer)."""
        if self._pid != os.getpid():  # a forked child never uses its parent's connection
            self._pid, self._conn = os.getpid(), None
        if self._conn is None or self._conn.broken or _closed_by_server(self._conn):
            old, self._conn = self._conn, None  # a failed connect leaves none, not a closed one
            if old is not None:
                old.close()
            self._conn = connect(self._dsn, self._settings)
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[DictRow]]:
        """One database transaction. A database that does not answer, or a connection lost
        mid-call, is `StoreUnavailableError`: whether a write committed is then unknown."""
        with self.answering():
            conn = self.connection()
            with conn.transaction():
                yield conn

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """A block that uses the connection: its `psycopg.OperationalError` (no answer, a
        connection lost) as `StoreUnavailableError`."""
        try:
            yield
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(f"{self.name} did not answer: {one_line(exc)}") from exc

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None
