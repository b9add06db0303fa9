"""The ground truth of a campaign: every effect a workload made, written down at the write with
the coordination system's own word on whether its executor still owned the work.

Never derived from splitbrain's events: the checker judges the detector against a record it did
not produce. Workers run in their own processes (so the nemesis can stop and kill them), so the
record is a JSON-lines file each appends to with one `write` per line (O_APPEND: lines of
different processes never interleave).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final, Self, TypedDict

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from detector.adapters import Ownership

TRUTH_ENV: Final = "SPLITBRAIN_CAMPAIGN_TRUTH"  # the file a worker process appends to
RUN_ENV: Final = "SPLITBRAIN_CAMPAIGN_RUN"  # the run a worker process belongs to
PROCESS_ENV: Final = "SPLITBRAIN_CAMPAIGN_PROCESS"  # the fleet's name of a worker process
# The blind spots of writes whose events never reached the detector: their worker's exit took
# them along (`kills`).
KILLED_UNSENT: Final = "killed_unsent"
SHUTDOWN_UNSENT: Final = "shutdown_unsent"
UNSENT: Final = frozenset({KILLED_UNSENT, SHUTDOWN_UNSENT})
# The blind spot of an owned write whose events may reach the detector after a takeover that
# followed it (`heard_late`): a source without `seq` is ordered by arrival (DESIGN §4), so a
# finding may rightly call it stale. Never a positive; it excuses no miss.
HEARD_LATE: Final = "heard_late"
# Its mirror, on a stale write whose events may reach the detector before the acquisition that
# displaced it (`heard_early`): arrival then puts the write inside its executor's own tenure, so
# no finding can call it stale. A positive all the same, counted blind when no finding names it.
HEARD_EARLY: Final = "heard_early"


class Write(BaseModel):
    """One effect at the recording destination."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run: int = Field(ge=0)
    workflow_key: str  # as the adapter names the work
    effect_key: str
    executor: str  # the worker id the adapter gives the executor
    epoch: int  # the executor's owner epoch, as the adapter gives it
    owned: bool  # the coordination system's record, read at the write
    evidence: str  # what that record said, in the system's terms (a token, a holder, an attempt)
    at: float  # wall-clock time of the write, for the time to the finding
    # False: the destination refused it (nothing was made; a finding should say rejected).
    committed: bool = True
    # An `effect_attempted` the work reported before its effect, nothing made (`committed` is
    # False): a positive only when stale (DESIGN's `stale_effect_attempt`, a warning), never a
    # duplicate. The worker may still make the effect afterwards, or fail first.
    attempt: bool = False
    # Set when the adapter cannot show this write by design: the code of the blind spot
    # (`Source.blind` says why), counted apart from misses; `HEARD_LATE` when it cannot show
    # its order, on an owned write (`HEARD_EARLY` on a stale one).
    blind: str | None = None
    # The fleet's name of the process that made it, where the executor is not the process but
    # what each of its starts takes anew (an etcd lease, a pod's identity): what a kill of that
    # process may have silenced (`kills`).
    process: str | None = None
    # The write's place in the coordination system's own order (etcd's revision, the API
    # server's resourceVersion), which the detector orders it by: a write whose worker was paused
    # between the server's answer and its reading of it is recorded late (`at`), not later.
    seq: int | None = None
    # When its executor heard the destination's answer and sent its receipt (`campaign_time`),
    # where that can be long after `at`: a partition held the reply back and the call was
    # retried until it healed. None: at the write.
    heard: float | None = None


class Owner(TypedDict):
    """A write's executor, as `TruthLog.record` takes it."""

    workflow_key: str
    executor: str
    epoch: int


def owner_of(ownership: Ownership) -> Owner:
    """The executor of the work an adapter's ownership names."""
    return Owner(
        workflow_key=ownership.workflow_key,
        executor=ownership.worker_id,
        epoch=ownership.owner_epoch,
    )


def campaign_time() -> float:
    """The wall clock as the campaign reads it, also in a worker whose clock the nemesis stepped
    (`nemesis.clock_env`): its libfaketime offset taken back off, so a write's time stays
    comparable with the finding's."""
    now = time.time()
    control = os.environ.get("FAKETIME_TIMESTAMP_FILE")
    if control is None:
        return now
    try:
        return now - float(Path(control).read_text().strip() or 0)
    except (OSError, ValueError):
        return now


class TruthLog:
    """The run's record; `from_env` in a worker process, the path in the campaign."""

    def __init__(self, path: Path | str, run: int = 0, process: str | None = None) -> None:
        self.path = Path(path)
        self.run = run
        self.process = process  # stamped on every write this process records

    @classmethod
    def from_env(cls) -> Self | None:
        """The campaign's log when this process runs under one (None: not in a campaign)."""
        path = os.environ.get(TRUTH_ENV)
        if not path:
            return None
        return cls(path, int(os.environ.get(RUN_ENV, "0")), os.environ.get(PROCESS_ENV))

    def env(self) -> dict[str, str]:
        """What a worker process of this run needs to find the log."""
        return {TRUTH_ENV: str(self.path), RUN_ENV: str(self.run)}

    def record(
        self,
        *,
        workflow_key: str,
        effect_key: str,
        executor: str,
        epoch: int,
        owned: bool,
        evidence: str,
        committed: bool = True,
        attempt: bool = False,
        blind: str | None = None,
        at: float | None = None,
        seq: int | None = None,
        heard: float | None = None,
    ) -> Write:
        """`at`: the write's time from a clock no fault steps (the destination's own), where
        this process's wall clock may be stepped (`nemesis.clock_env`); else `campaign_time()`."""
        write = Write(
            run=self.run,
            workflow_key=workflow_key,
            effect_key=effect_key,
            executor=executor,
            epoch=epoch,
            owned=owned,
            evidence=evidence,
            at=campaign_time() if at is None else at,
            committed=committed and not attempt,
            attempt=attempt,
            blind=blind,
            process=self.process,
            seq=seq,
            heard=heard,
        )
        line = (write.model_dump_json() + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return write

    def rewrite(self, writes: Iterable[Write]) -> None:
        """Replace the record with `writes`: for marks set once every worker of the run is
        stopped."""
        self.path.write_text("".join(w.model_dump_json() + "\n" for w in writes))

    def writes(self) -> Iterator[Write]:
        """Every write recorded so far."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        for line in text.splitlines():
            if line:
                yield Write.model_validate_json(line)


Acquired = Iterable[tuple[str, int, float]]  # workflow key, epoch, time on the writes' clock


def _takeovers(acquired: Acquired) -> dict[str, list[tuple[int, float]]]:
    """Each workflow's acquisitions: (epoch, time)."""
    takeovers: dict[str, list[tuple[int, float]]] = {}
    for workflow_key, epoch, at in acquired:
        takeovers.setdefault(workflow_key, []).append((epoch, at))
    return takeovers


def _mark(truth: TruthLog, code: str, marked: Callable[[Write], bool]) -> None:
    """Give `code` to each write not marked yet that `marked` accepts."""
    truth.rewrite(
        w.model_copy(update={"blind": code}) if w.blind is None and marked(w) else w
        for w in list(truth.writes())
    )


def heard_late(truth: TruthLog, acquired: Acquired, within_s: float) -> None:
    """Mark `HEARD_LATE` each owned write, not marked yet, that an acquisition of a higher epoch
    of its work followed within `within_s` of the write, or of its receipt when that was `heard`
    later (`acquired`: workflow key, epoch, time on the writes' clock): its worker's sink may
    still hold its events then (a pause, a reply a partition held back, a loaded machine), and
    arrival puts them after the acquisition."""
    takeovers = _takeovers(acquired)

    def late(w: Write) -> bool:
        last = w.at if w.heard is None else max(w.at, w.heard)
        return w.owned and any(
            epoch > w.epoch and w.at <= at <= last + within_s
            for epoch, at in takeovers.get(w.workflow_key, ())
        )

    _mark(truth, HEARD_LATE, late)


def heard_early(
    truth: TruthLog,
    acquired: Acquired,
    within_s: float,
    outages: Iterable[tuple[float, float]] = (),
) -> None:
    """Mark `HEARD_EARLY` each stale write, not marked yet, that every acquisition displacing it
    (a higher epoch of its work, acquired before it) may have reached the detector after it:
    made less than `within_s` before the write (the acquirer's sink sends in batches, late on a
    loaded machine), or while Kafka was down (`outages`: down, back; wall clock), the write
    coming before `within_s` after the broker's return. An outage holds both in their workers'
    sinks, and on the broker's return nothing orders the two producers."""
    takeovers = _takeovers(acquired)
    spans = list(outages)

    def held(acquired_at: float, w: Write) -> bool:
        return w.at - acquired_at <= within_s or any(
            down <= acquired_at <= up and w.at <= up + within_s for down, up in spans
        )

    def early(w: Write) -> bool:
        displacing = [
            at for epoch, at in takeovers.get(w.workflow_key, ()) if epoch > w.epoch and at <= w.at
        ]
        return not w.owned and bool(displacing) and all(held(at, w) for at in displacing)

    _mark(truth, HEARD_EARLY, early)
