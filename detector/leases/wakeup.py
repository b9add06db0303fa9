"""Wake-ups for idle runners: the store NOTIFYs a job's class when its enqueue commits, and a
runner waiting for that class claims at once instead of at its next poll.

LISTEN is session state, so the listener has a connection of its own, made directly to
PostgreSQL (a transaction pooler such as PgBouncer's transaction mode cannot hold it: run the
runner with `listen=False` there). The poll stays, for what no notification announces: a retry
whose backoff ends, a job scheduled for later, a lease that expired, and anything enqueued while
the listener was reconnecting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

import psycopg
from psycopg import sql

from detector.leases.db import connect
from detector.leases.errors import StoreUnavailableError
from detector.leases.store import WAKEUP_CHANNEL

log = logging.getLogger(__name__)

CHECK_S: Final = 0.5  # how soon a listener notices it was stopped
RETRY_S: Final = 1.0  # the pause before it connects again


class Wakeup(threading.Thread):
    """Calls `wake` (from this thread) for each job of `job_class` enqueued while it listens."""

    def __init__(self, dsn: str, job_class: str, wake: Callable[[], None]) -> None:
        super().__init__(name=f"wakeup-{job_class}", daemon=True)
        self._dsn = dsn
        self._job_class = job_class
        self._wake = wake
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                with connect(self._dsn) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(WAKEUP_CHANNEL)))
                    while not self._stop_event.is_set():
                        for note in conn.notifies(timeout=CHECK_S):
                            if note.payload == self._job_class:
                                self._wake()
            except (StoreUnavailableError, psycopg.OperationalError) as exc:
                log.warning("wake-ups paused class=%s: %s", self._job_class, exc)
            self._stop_event.wait(RETRY_S)
