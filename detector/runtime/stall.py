"""Saying so when the worker stalls on Kafka: nothing committed for a while, and the brokers
reporting errors meanwhile (two of three brokers down, `min.insync.replicas` unmet, the group or
transaction coordinator unreachable).

Why: the client library retries such errors on its own and the worker waits for it, which is
right (nothing is lost: the input waits in Kafka), but then nothing says why findings stopped. One
warning names the cause and Kafka's last error; one line says when commits resume. The check runs
on a thread of its own: with two brokers of three down, a transaction call can block the loop for
as long as the outage lasts.

A commit that waits past `give_up_s` ends the process instead: librdkafka (2.16) can wait inside
`send_offsets_to_transaction` for ever once the broker that coordinated the group is gone for good
(librdkafka #5511, #5456), and only a new client looks the coordinator up again. The transaction
left open commits nothing; the next process fences it by its transactional id and goes on from the
committed offsets, so giving up loses nothing and writes nothing twice.

The same wait happens with every broker up: after a single broker's restart, the fault campaign
saw a commit blocked for 3.5 minutes with the broker serving all along. So a commit past its own
timeout ends the process sooner, after `serving_grace_s`, when the cluster has served every
partition the transaction needs for that long (`serving`): the brokers are not what it waits for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

STALL_AFTER_S: Final = 30.0  # a transaction call gives up at 30 s: longer is no hiccup
SERVING_GRACE_S: Final = 20.0  # a cluster back from an outage: its coordinators load meanwhile
_CHECK_EVERY_S: Final = 5.0


class StallWatch:
    """Fed by the loop: `progressed` on each commit (or an idle poll that holds partitions),
    `kafka_error` on each client or transaction error, `committing` around each commit; `start`
    runs `check` every few seconds on a daemon thread."""

    def __init__(
        self,
        after_s: float = STALL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        give_up_s: float | None = None,
        give_up: Callable[[], None] = lambda: None,
        serving: Callable[[], bool] = lambda: False,
        serving_grace_s: float = SERVING_GRACE_S,
    ) -> None:
        self.after_s = after_s
        self.give_up_s = give_up_s
        self._give_up = give_up
        self._serving = serving
        self.serving_grace_s = serving_grace_s
        self._serving_since: float | None = None  # while a commit is past after_s
        self._clock = clock
        self._progress_at = clock()
        self._last_error: str | None = None  # since the last progress
        self._stalled_since: float | None = None
        self._committing_since: float | None = None

    def kafka_error(self, error: object) -> None:
        """The client's `error_cb`, and the worker's failed transactions."""
        self._last_error = str(error)

    def committing(self, busy: bool) -> None:
        """A commit is waiting for Kafka (True), or is over (False)."""
        self._committing_since = self._clock() if busy else None
        self._serving_since = None

    def start(self, assigned: Callable[[], bool]) -> None:
        """Check every few seconds, whatever the loop is blocked in, until the process ends."""

        def watch() -> None:
            while True:
                time.sleep(_CHECK_EVERY_S)
                self.check(assigned=assigned())

        threading.Thread(target=watch, name="stall-watch", daemon=True).start()

    def progressed(self) -> None:
        now = self._clock()
        if self._stalled_since is not None:
            log.info("resumed: committing again after %.0f s stalled", now - self._stalled_since)
            self._stalled_since = None
        self._progress_at = now
        self._last_error = None

    def check(self, *, assigned: bool) -> None:
        """Warn once per stall: only when Kafka reported an error since the last progress, or a
        commit has waited for it all along (a standby worker with no partition, or an idle one,
        is not stalled)."""
        now = self._clock()
        since = self._committing_since
        waiting = since is not None and now - since >= self.after_s
        if since is not None and self.give_up_s is not None:
            why = self._why_give_up(now, since, waiting=waiting)
            if why is not None:
                log.error(
                    "giving up: a commit has waited %.0f s for Kafka, %s (last error: %s); "
                    "exiting so that a new process looks the coordinators up again (its "
                    "transactional id fences this one's open transaction: nothing is lost or "
                    "written twice)",
                    now - since,
                    why,
                    self._last_error or "none reported",
                )
                self._give_up()
                return
        if self._stalled_since is not None or (self._last_error is None and not waiting):
            return
        if now - self._progress_at < self.after_s:
            return
        self._stalled_since = self._progress_at
        if waiting:
            cause = "a commit has waited for Kafka all along"
        elif assigned:
            cause = "transactions cannot commit"
        else:
            cause = (
                "no input partition assigned and restored: the group coordinator or the "
                "changelog is unreachable"
            )
        log.warning(
            "stalled on Kafka: nothing committed for %.0f s, %s (brokers down, or "
            "min.insync.replicas cannot be met); last error: %s. Waiting for the brokers: "
            "the input waits in Kafka, nothing is lost",
            now - self._progress_at,
            cause,
            self._last_error or "none reported",
        )

    def _why_give_up(self, now: float, since: float, *, waiting: bool) -> str | None:
        """Past `give_up_s`; or past its own timeout while the cluster served what it needs for
        `serving_grace_s` (asked only then: a commit in time costs no broker round trip)."""
        assert self.give_up_s is not None
        if now - since >= self.give_up_s:
            return f"past --commit-give-up-s {self.give_up_s:g}"
        if not waiting or not self._serving():
            self._serving_since = None
            return None
        if self._serving_since is None:
            self._serving_since = now
        served = now - self._serving_since
        if served < self.serving_grace_s:
            return None
        return (
            f"past its own {self.after_s:g} s timeout although the cluster has served every "
            f"partition the transaction needs for {served:.0f} s (a client that lost track of "
            "its coordinator: librdkafka #5456)"
        )
