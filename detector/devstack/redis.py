"""A real, local Redis server for the Celery adapter's tests and demo, from Debian's
`redis-server` package.

Why this exists: the zombie the Celery adapter reports comes from the Redis transport's own
redelivery (a message unacknowledged past its visibility timeout is restored to the queue), so
it is reproduced against a real server, never a fake. The server runs in the foreground on a
free loopback port, with no Unix socket, in a temporary directory, and is stopped by PID:
SIGTERM, then SIGKILL. No persistence unless asked for (`persist`: an append-only file synced at
every write, so that queued and unacknowledged messages survive a restart on the same port).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Final

from detector.devstack.process import ChildServer, came_up, last_lines, spawn
from detector.errors import SplitbrainError

_LOG_FILE: Final = "redis.log"


class LocalRedisError(SplitbrainError, RuntimeError):
    """The local server could not be found, started or stopped."""


def redis_server() -> str:
    """The `redis-server` program, or a `LocalRedisError` saying what to install."""
    found = shutil.which("redis-server")
    if found is None:
        raise LocalRedisError(
            "redis-server is missing: install Debian's redis-server package "
            "(apt-get install --no-install-recommends redis-server)"
        )
    return found


def redis_argv(program: str, port: int, directory: Path, *, persist: bool = False) -> list[str]:
    """The server's command line: loopback only, nothing written but its log (with `persist`,
    an append-only file too, fsynced at every write)."""
    aof = ("--appendonly", "yes", "--appendfsync", "always") if persist else ("--appendonly", "no")
    return [
        *(program, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", ""),
        *("--save", "", *aof, "--dir", str(directory)),
        *("--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"),
    ]


def redis_ready(port: int) -> bool:
    """The server answers PING on `port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class LocalRedis(ChildServer):
    """One throwaway Redis server: `start()` starts it and waits for PING, `close()` stops it by
    PID and deletes its directory. Also a context manager. `stop()` then `start()` restarts it
    on the same port (with `persist`, with its data)."""

    def __init__(self, *, start_timeout: float = 30.0, persist: bool = False) -> None:
        self._program = redis_server()
        super().__init__("splitbrain-redis-", start_timeout)
        self.persist = persist

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self._root / _LOG_FILE

    def start(self) -> None:
        self._proc = spawn(
            redis_argv(self._program, self.port, self._root, persist=self.persist),
            self.log_path,
            stdin=subprocess.DEVNULL,
        )
        if not came_up(self._proc, lambda: redis_ready(self.port), self.start_timeout, 0.05):
            raise LocalRedisError(
                f"redis-server did not start on port {self.port} "
                f"(exit {self._proc.poll()}):\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 20) -> str:
        return last_lines(self.log_path, lines, "(no server log yet)")
