"""The heartbeat of one claimed job: a thread with its own database connection.

It runs outside the tool call's thread and event loop, so a tool that blocks the loop, or hangs
in native code, cannot stop it for as long as a tool call may take. It also never keeps a dead
job's lease alive: it stops extending when the executor says it has finished, when the executor
has not reported for longer than a tool call may last (its loop is stuck), and at the stage time
limit. Each extension's answer is one of three, and each is kept apart:

- a new lease: ownership confirmed until `lease_until`;
- zero rows (`LeaseLost`): another owner, or an expired lease; the executor is told at once;
- no answer (`StoreUnavailableError`): ownership uncertain; reported once per outage, with the
  last confirmed lease, and extension goes on being tried, because only the database can say.

The period is kept from one extension's send to the next's, not from its answer: a slow or failed
extension does not push the next one back unless it took longer than a period (then the next is
sent as soon as it returns). So after the last success, attempt R+1 is sent H + R x max(H, T)
later at most, T being how long a failed attempt can take, which the store's connection bounds
(`detector.leases.db`: 10 s for a statement or a silent network, 10 s more to reconnect): the
class's rule L > H + R x max(H, T) + J counts it (`JobClass.extend_timeout_s`). The local count
of the lease starts when the claim or the extension was sent, never when it returned, so it never
outlasts the database's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from detector.leases.errors import StoreUnavailableError
from detector.leases.policy import JobClass
from detector.leases.store import Lease, LeaseLost, LeaseStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Uncertainty:
    """What is known when the store stops answering: whose lease, and until when it held."""

    lease: Lease
    last_confirmed_until: datetime
    error: str


class Heartbeat(threading.Thread):
    """Extends `lease` every heartbeat period through `store` (used by this thread only)."""

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        policy: JobClass,
        *,
        on_lost: Callable[[], None],
        on_uncertain: Callable[[Uncertainty], None],
        claim_sent: float | None = None,
    ) -> None:
        super().__init__(name=f"heartbeat-{lease.job_id}", daemon=True)
        self._store = store
        self._policy = policy
        self._on_lost = on_lost
        self._on_uncertain = on_uncertain
        self._stop_event = threading.Event()
        self._answered = threading.Condition()
        self._answers = 0
        # When the claim was sent (monotonic): its statement ran after it, so the lease lasts at
        # least L from there. Counted from the claim's return, it could outlast the database's.
        started = time.monotonic() if claim_sent is None else claim_sent
        self._began = started
        self._reported = time.monotonic()
        self.lease = lease
        self._held_until = started + policy.lease_s
        self.lost = False
        self.uncertain = False

    # -- the executor's side ------------------------------------------------------------------

    def report(self) -> None:
        """The executor is alive: keep extending."""
        self._reported = time.monotonic()

    def finish(self) -> None:
        """The executor has finished with the job: extend no more."""
        self._stop_event.set()

    def presumed_held(self) -> bool:
        """Whether the lease can still be held by the local count: from the last confirmed
        extension's start, less the reserve. A `False` forbids new irreversible steps."""
        return not self.lost and time.monotonic() < self._held_until - self._policy.reserve_s

    def wait_for_answer(self, timeout: float) -> bool:
        """Until the store answers an extension (a lease, or lease lost) that was sent after
        this call; False on timeout. What the executor does with a result it holds while
        ownership is uncertain: it asks again rather than guessing."""
        deadline = time.monotonic() + timeout
        with self._answered:
            seen = self._answers
            while self._answers <= seen and not self.lost:
                left = deadline - time.monotonic()
                if left <= 0 or not self.is_alive():
                    return False
                self._answered.wait(min(left, 0.1))
        return True

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        period = self._policy.heartbeat_s
        silent_after = self._policy.tool_timeout_s + period
        stage_end = self._began + self._policy.stage_time_limit_s
        due = self._began + period
        while not self._stop_event.wait(max(0.0, due - time.monotonic())):
            now = time.monotonic()
            due = now + period  # from this send, whatever its answer takes
            if now - self._reported > silent_after:
                log.warning(
                    "heartbeat stopped job=%s token=%d reason=executor_silent silent_s=%.1f",
                    self.lease.job_id,
                    self.lease.fencing_token,
                    now - self._reported,
                )
                return
            if now > stage_end:
                log.warning(
                    "heartbeat stopped job=%s token=%d reason=stage_time_limit",
                    self.lease.job_id,
                    self.lease.fencing_token,
                )
                return
            if not self._extend(now):
                return

    def _extend(self, sent: float) -> bool:
        """One extension; False when the lease is lost and the thread should end."""
        left = self._held_until - sent
        if left < self._policy.heartbeat_s + self._policy.reserve_s:
            # Not "extend early": fewer misses than this one left before the lease runs out.
            log.warning(
                "extend late job=%s token=%d left_s=%.2f period_s=%g reserve_s=%g",
                self.lease.job_id,
                self.lease.fencing_token,
                left,
                self._policy.heartbeat_s,
                self._policy.reserve_s,
            )
        try:
            answer = self._store.extend(self.lease)
        except StoreUnavailableError as exc:
            if not self.uncertain:
                self.uncertain = True
                self._on_uncertain(Uncertainty(self.lease, self.lease.lease_until, str(exc)))
            return True
        with self._answered:
            self._answers += 1
            if isinstance(answer, LeaseLost):
                self.lost = True
            else:
                self.lease = answer
                self._held_until = sent + self._policy.lease_s
                if self.uncertain:
                    log.info(
                        "ownership confirmed again job=%s token=%d",
                        answer.job_id,
                        answer.fencing_token,
                    )
                self.uncertain = False
            self._answered.notify_all()
        if self.lost:
            self._on_lost()
            return False
        return True
