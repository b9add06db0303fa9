"""A real, local PostgreSQL server for the lease store's tests, from Debian's `postgresql` package.

Why this exists: the lease store's guarantees (one claimer per job, fenced writes, the outbox in
the transition's transaction) are PostgreSQL's, so they are tested against a real server, never
a fake. `initdb` and `pg_ctl` build and run a throwaway cluster in a temporary directory, on a
free loopback port, with trust authentication on 127.0.0.1 only and no Unix socket. The server is
stopped by `pg_ctl stop -m fast`, then SIGKILL by PID if it does not go.

`initdb` refuses to run as root, and CI runs as root: as root, every server command runs as the
unprivileged system user `splitbrain-pg` (created if missing), which owns the directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

import psycopg
from psycopg import sql

from detector.closing import Started
from detector.devstack import process
from detector.errors import SplitbrainError

SERVER_USER: Final = "splitbrain-pg"
SUPERUSER: Final = "splitbrain"
_DEBIAN_BINARIES: Final = Path("/usr/lib/postgresql")
_LOG_FILE: Final = "server.log"
# Appended to the postgresql.conf that initdb writes: the later line wins.
_SETTINGS: Final = (
    "listen_addresses = '127.0.0.1'",
    "unix_socket_directories = ''",
    # The tests restart the server process, never the machine: the page cache keeps everything
    # a crash of the process leaves behind, so flushing it to disk only costs the shared CPU.
    "fsync = off",
    "shared_buffers = 32MB",
    "max_connections = 100",
)


class LocalPostgresError(SplitbrainError, RuntimeError):
    """The local server could not be found, set up, started or stopped."""


def postgres_binaries() -> Path:
    """The directory of `initdb` and `pg_ctl`: Debian's newest `/usr/lib/postgresql/N/bin`,
    else wherever `initdb` is on PATH (Debian does not put them there)."""
    versions = sorted(
        (p for p in _DEBIAN_BINARIES.glob("*/bin") if (p / "initdb").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1,
    )
    if versions:
        return versions[-1]
    initdb = shutil.which("initdb")
    if initdb is None:
        raise LocalPostgresError(
            "PostgreSQL's initdb is missing: install Debian's postgresql package "
            "(apt-get install postgresql)"
        )
    return Path(initdb).resolve().parent


def _server_user() -> str | None:
    """Who runs the server: `splitbrain-pg` when we are root (created on first use), else us."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        pwd.getpwnam(SERVER_USER)
        return SERVER_USER
    proc = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            SERVER_USER,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        pwd.getpwnam(SERVER_USER)  # another process may have created it meanwhile
    except KeyError:
        raise LocalPostgresError(
            f"cannot create the system user {SERVER_USER}: {proc.stderr.strip()}"
        ) from None
    return SERVER_USER


class LocalPostgres(Started):
    """One throwaway PostgreSQL cluster: `start()` creates and starts it, `restart()` keeps its
    data and port, `close()` stops it and deletes its directory. Also a context manager."""

    def __init__(self, *, start_timeout: float = 60.0) -> None:
        self.start_timeout = start_timeout
        self.port = process.free_port()
        self._bin = postgres_binaries()
        self._user = _server_user()
        self._root = Path(tempfile.mkdtemp(prefix="splitbrain-pg-"))
        if self._user is not None:
            shutil.chown(self._root, self._user, self._user)
        self._initialised = False

    @property
    def data_dir(self) -> Path:
        return self._root / "data"

    @property
    def log_path(self) -> Path:
        return self._root / _LOG_FILE

    @property
    def dsn(self) -> str:
        """The superuser's connection string to the `postgres` database."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=dbname
        )

    def start(self) -> None:
        """Create the cluster on first use, then start the server and wait until it accepts
        connections; on failure, raise with the server log's tail."""
        if not self._initialised:
            self._run(
                "initdb",
                "--pgdata",
                str(self.data_dir),
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--no-locale",
            )
            with (self.data_dir / "postgresql.conf").open("a") as conf:
                conf.write(
                    "\n# detector/devstack/postgres.py\n"
                    + "".join(f"{line}\n" for line in (*_SETTINGS, f"port = {self.port}"))
                )
            self._initialised = True
        self._run(
            "pg_ctl",
            "start",
            "--pgdata",
            str(self.data_dir),
            "--log",
            str(self.log_path),
            "--wait",
            "--timeout",
            str(int(self.start_timeout)),
        )

    def stop(self, *, mode: Literal["fast", "immediate"] = "fast", timeout: float = 30.0) -> None:
        """`pg_ctl stop -m MODE` (`fast`, or `immediate` for a crash that recovery repairs on
        the next start), then SIGKILL by PID if the server is still there."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(LocalPostgresError):
            self._run(
                "pg_ctl",
                "stop",
                "--pgdata",
                str(self.data_dir),
                "--mode",
                mode,
                "--wait",
                "--timeout",
                str(int(timeout)),
            )
        if self._alive(pid):
            # pg_ctl starts the postmaster in a session of its own: its group is the server.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10.0
            while self._alive(pid):
                if time.monotonic() > deadline:
                    raise LocalPostgresError(f"postgres pid {pid} survived SIGKILL")
                time.sleep(0.05)
            # Until init reaps it, the dead postmaster's PID still answers kill(pid, 0), and
            # the next start would take its lock file for a running server's.
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)

    def restart(self, *, crash: bool = False) -> None:
        """Stop and start on the same data and port; `crash=True` stops it the way a crash
        would (`immediate`: no checkpoint, WAL replay on start)."""
        self.stop(mode="immediate" if crash else "fast")
        self.start()

    def close(self) -> None:
        """Stop the server and delete its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    def pid(self) -> int | None:
        """The postmaster's PID from `postmaster.pid`, if that process is alive and ours."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if self._alive(pid) else None

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """A new database, empty or a copy of `template` (which nobody may be connected to);
        its DSN."""
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(query)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, closing any connection still open to it."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def log_tail(self, lines: int = 30) -> str:
        return process.last_lines(self.log_path, lines, "(no server log yet)")

    def _alive(self, pid: int) -> bool:
        """Running (not a zombie) and a postgres on this data directory: a recycled PID is not."""
        return process.runs_with(pid, str(self.data_dir))

    def _run(self, program: str, *args: str) -> None:
        argv: Sequence[str] = [str(self._bin / program), *args]
        if self._user is not None:
            argv = ["runuser", "-u", self._user, "--", *argv]
        # PG* variables of the caller's shell (PGDATA, PGPORT, ...) would steer the tools.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        proc = subprocess.run(
            argv, cwd=self._root, env=env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise LocalPostgresError(
                f"{program} {args[0]} failed (exit {proc.returncode}): "
                f"{(proc.stdout + proc.stderr).strip()}\n--- {self.log_path}\n{self.log_tail()}"
            )
