"""When `Detector.advance` must look at a workflow again: a finding can resolve with no event
only by its displaced owner's silence, so each workflow is due when its first open finding goes
quiet, or its release's quiet period ends; and every workflow now and then, for idleness."""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush

from detector.contracts.findings import Status

from ._state import WorkflowState


@dataclass(slots=True)
class Deadlines:
    """Not persisted: the first `advance` of a detector sweeps everything and schedules again."""

    quiet_period_s: float
    sweep_every_s: float
    # A heap of (time, key), and the earliest time each key is in it for (later entries of a
    # key are skipped).
    _due: list[tuple[float, str]] = field(default_factory=list)
    _due_at: dict[str, float] = field(default_factory=dict)
    _swept_at: float | None = None

    def sweep_due(self, now: float) -> bool:
        """Is it time to look at every workflow? Then the next sweep is `sweep_every_s` away."""
        sweep = self._swept_at is None or now - self._swept_at >= self.sweep_every_s
        if sweep:
            self._swept_at = now
        return sweep

    def due(self, now: float) -> list[str]:
        """The workflows whose time came: once each, whatever they were scheduled for."""
        due = self._due
        scheduled = self._due_at
        keys: list[str] = []
        while due and due[0][0] <= now:
            at, key = heappop(due)
            if scheduled.get(key) == at:
                del scheduled[key]
                keys.append(key)
        return keys

    def schedule(self, key: str, workflow: WorkflowState, now: float | None) -> None:
        """When `advance` must look at the workflow again: its first open episode to go quiet,
        or, once none is open, the end of its release's quiet period. Time changes nothing
        else: every other change comes with an event, and is settled then."""
        if now is None:
            return  # no clock (`audit`): `finish` settles what time would
        quiet_period = self.quiet_period_s
        due: float | None = None
        settled = True
        for episode in workflow.episodes.values():
            if episode.status is Status.OPEN:
                settled = False
                heard = episode.last_stale_at
                if (
                    heard is not None
                    and heard + quiet_period > now
                    and (due is None or heard + quiet_period < due)
                ):
                    due = heard + quiet_period
        if settled and workflow.released_at is not None:
            due = workflow.released_at + quiet_period
        if due is None:
            return
        was = self._due_at.get(key)
        if was is None or due < was:
            # An entry due later stays in the heap and is skipped when it comes out; an earlier
            # one is enough: the workflow is scheduled again when it is looked at.
            self._due_at[key] = due
            heappush(self._due, (due, key))

    def drop(self, key: str) -> None:
        """Forget the workflow's time until the next sweep (its state failed)."""
        self._due_at.pop(key, None)
