"""The engine: feed it events in arrival order, get finding revisions back.

It holds no clock. A worker passes `at`, its processing time, and measures silence on it; `audit`
passes nothing, and `finish` measures silence on each workflow's own believed times. Order is
decided by `seq`, or by arrival when an event has none.

`Detector` holds the workflows' states and hands each job to its own part: taking an event in
(`_intake.Intake`, with the caps of `_retention.Retention`), settling the episodes it touched
(`_settling.Settler`), and the deadlines at which time alone may settle one
(`_deadlines.Deadlines`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding, Severity, Status

from ._clock import believe
from ._config import Config
from ._counts import Counters, FindingStats
from ._deadlines import Deadlines
from ._intake import Intake
from ._labels import LabelBounds
from ._lease import LeaseHealth
from ._records import union
from ._render import render
from ._retention import IDS_CUT, Retention
from ._settling import FindingUpdate, Settler, hinges_on_silence
from ._silence import signs_of_life
from ._state import Cut, Episode, WorkflowState, forget_packed


@dataclass(frozen=True, slots=True)
class Advanced:
    """What letting time pass did: revisions to publish, and the workflows it changed in place
    or removed (evicted), for the owner of the states to persist."""

    updates: list[FindingUpdate]
    changed: set[str]


@runtime_checkable
class SweptStates(Protocol):
    """A table of states kept encoded that can tell, without decoding them, which ones a sweep
    of `Detector.advance` may pass by (`detector.core.sweep_marks`)."""

    def sweep_keys(self, idle_before: float, expired_before: float) -> list[str]:
        """Every key but those of states neither `WorkflowState.watched` nor due: idle for
        most (`last_at` at or before `idle_before`), expired for one that is
        `WorkflowState.remnant_only` (`last_at` unknown, or at or before `expired_before`)."""
        ...


@dataclass(slots=True)
class Detector:
    """Per-workflow state lives in `states`: a dict here, a changelog-backed table in a worker."""

    config: Config = field(default_factory=Config)
    states: MutableMapping[str, WorkflowState] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    finding_stats: FindingStats = field(default_factory=FindingStats)
    lease_health: LeaseHealth = field(init=False)
    _deadlines: Deadlines = field(init=False, repr=False)
    _settler: Settler = field(init=False, repr=False)
    _retention: Retention = field(init=False, repr=False)
    _intake: Intake = field(init=False, repr=False)

    def __post_init__(self) -> None:
        config = self.config
        self.lease_health = LeaseHealth(
            config.missed_heartbeats, config.jitter_reserve_s, LabelBounds(config.max_label_values)
        )
        self._deadlines = Deadlines(config.quiet_period_s, config.idle_sweep_s)
        self._settler = Settler(self.counters, self.finding_stats, self._deadlines)
        self._retention = Retention(config, self.counters)
        self._intake = Intake(
            config,
            self.counters,
            self.lease_health,
            self._retention,
            self._settler,
            self._deadlines,
        )

    def observe(self, event: OwnershipEvent, at: float | None = None) -> list[FindingUpdate]:
        """Account for one event; return the finding revisions it causes (usually none).

        `at` is a worker's processing time. Without it (`audit`), the event's believed
        `observed_at` is what silence is measured on, at `finish`.
        """
        self.counters.events += 1
        key = event.workflow_key
        workflow = self.states.get(key)
        if workflow is None:
            workflow = self.states[key] = WorkflowState()
        updates = self._intake.take(key, workflow, event, at)
        if self._retention.resettle:
            updates.extend(self._resettled(key, at))
        return updates

    def _resettled(self, key: str, at: float | None) -> list[FindingUpdate]:
        """What `Retention.resettle` asks for: every finding of the workflow settled again."""
        self._retention.resettle = False
        workflow = self.states.get(key)
        if workflow is None or not workflow.found:
            return []
        return self._settler.settle_all(key, workflow, at, list(workflow.episodes.values()))

    def failed(self, workflow_key: str) -> None:
        """An event of `workflow_key` made `observe` raise, and the caller goes on without it (a
        worker dead-letters it): later revisions of the workflow's findings say
        `evidence_truncated`, and are never of high confidence.

        The state stays as the exception left it. `observe` changes it in place, one field at a
        time, so each field still holds a value of its type: what it lacks is part of what that
        one event would have added, and the mark says so. Rolling back would take a copy of
        every state before every event. Should what it left make a later event of the workflow
        raise too, that event goes the same way: the workflow degrades, its partition does not.
        Nothing is rendered here (rendering may be what raised): each finding carries the mark
        from its next revision on, and none is published twice since none is published here."""
        workflow = self.states.get(workflow_key)
        if workflow is None:
            workflow = self.states[workflow_key] = WorkflowState()
        self._retention.cut(workflow, Cut.ENGINE_ERROR)

    def advance(
        self, now: float, on_error: Callable[[str, Exception], None] | None = None
    ) -> Advanced:
        """Let the worker's time pass: resolve episodes whose displaced owner went quiet; evict
        idle state. Returns the revisions to publish and the workflows to persist.

        Between sweeps only the workflows whose time is due are looked at (`Deadlines`), so a
        tick costs what it finds to do, however many workflows and open findings are held. Idle
        workflows are found by a sweep of every state at most every `idle_sweep_s`, so one is
        evicted between `idle_ttl_s` and `idle_ttl_s + idle_sweep_s` after its last event, and a
        remnant removed as late after `remnant_ttl_s`.

        `on_error`: a worker's, so that an exception on one workflow costs that workflow alone
        (marked as `failed`, no longer watched until the next sweep) and is reported; without
        it (`audit`, tests) the exception goes up.
        """
        updates: list[FindingUpdate] = []
        changed: set[str] = set()
        sweep = self._deadlines.sweep_due(now)
        for key in self._swept_keys(now) if sweep else self._deadlines.due(now):
            try:
                self._advance_one(key, now, sweep, updates, changed)
                if self._retention.resettle:  # compacting cut what every finding is rendered from
                    updates.extend(self._resettled(key, now))
            except Exception as exc:
                if on_error is None:
                    raise
                self.failed(key)
                self._settler.watched.discard(key)
                self._deadlines.drop(key)
                changed.add(key)
                on_error(key, exc)
        return Advanced(updates, changed)

    def _advance_one(
        self, key: str, now: float, sweep: bool, updates: list[FindingUpdate], changed: set[str]
    ) -> None:
        config = self.config
        workflow = self.states.get(key)
        if workflow is None:
            self._settler.watched.discard(key)
            return
        open_eps = [
            episode for episode in workflow.episodes.values() if episode.status is Status.OPEN
        ]
        if open_eps:
            resolved = self._settler.settle_all(key, workflow, now, open_eps)
            if resolved:
                updates.extend(resolved)
                changed.add(key)
        if workflow.remnant_only:
            if workflow.last_at is None:
                # A remnant of a version that did not stamp it: its time starts now.
                workflow.last_at = now
                changed.add(key)
            # Expired: no reader can see its findings' revisions any more (`remnant_ttl_s`).
            idle = sweep and now - workflow.last_at >= config.remnant_ttl_s
        else:
            idle = (
                sweep
                and workflow.last_at is not None
                and now - workflow.last_at >= config.idle_ttl_s
            )
        settled = all(episode.status is Status.RESOLVED for episode in workflow.episodes.values())
        released = (
            workflow.released_at is not None
            and now - workflow.released_at >= config.quiet_period_s
            and settled
        )
        if not (released or idle):
            self._settler.watch(key, workflow)
            self._deadlines.schedule(key, workflow, now)
            return
        if not workflow.episodes and (workflow.past is None or idle):
            del self.states[key]
        elif idle and settled:
            # Forgotten, but its findings must not restart their revisions while a reader can
            # still see them: what their later revisions need is kept (`WorkflowState.remnant`).
            self.states[key] = workflow.remnant(now)
        elif workflow.evidence or workflow.ids:
            # Compacted: acquisitions, fences, effects and episodes stay; raw events go.
            self._retention.remember(workflow, workflow.evidence)
            workflow.evidence = ()
            workflow.undisplaced = None
            forget_packed(workflow)
            workflow.ids = workflow.ids_packed = None
            workflow.cut |= int(Cut.EVIDENCE) | IDS_CUT
            workflow.released_at = None
        else:
            self._settler.watch(key, workflow)
            return
        self._settler.watch(key, self.states.get(key))
        changed.add(key)
        if idle and workflow.remnant_only:
            self.counters.evicted_expired += 1
        elif idle:
            self.counters.evicted_idle += 1
        else:
            self.counters.evicted_released += 1

    def _swept_keys(self, now: float) -> list[str]:
        """Every state a sweep must look at; a store that keeps states encoded names only those
        that are watched or idle, without decoding the rest (`SweptStates`)."""
        states = self.states
        if isinstance(states, SweptStates):
            config = self.config
            return states.sweep_keys(now - config.idle_ttl_s, now - config.remnant_ttl_s)
        return list(states)

    def finish(self) -> list[FindingUpdate]:
        """The end of a recorded history (`audit`): silence measured per workflow on its own
        believed times, never on another workflow's clock nor on the absence of events."""
        updates: list[FindingUpdate] = []
        quiet_period = self.config.quiet_period_s
        for key, workflow in self.states.items():
            if not workflow.clock:
                if workflow.found:
                    updates.extend(
                        self._settler.settle_all(
                            key, workflow, None, list(workflow.episodes.values())
                        )
                    )
                continue
            believed = believe(workflow.clock, self.config.clock_skew_s)
            self.counters.times_disbelieved += believed.disbelieved
            if not workflow.found:
                continue
            now = believed.now
            alive = signs_of_life(workflow)
            for episode in workflow.episodes.values():
                # Silence is measured from the displaced epoch's last sign of life.
                heard = (
                    None
                    if episode.stale is None
                    else union(episode.stale, alive.get(episode.displaced_epoch))
                )
                then = None if heard is None else believed.at(heard.latest)
                quiet = now is not None and then is not None and now - then >= quiet_period
                if (workflow.cut & Cut.CLOCK or believed.cut) and hinges_on_silence(
                    workflow, episode
                ):
                    episode.truncated = True  # the times it is measured on were partly forgotten
                update = self._settler.settle(key, workflow, episode, quiet, None)
                if update is not None:
                    updates.append(update)
        return updates

    def findings(self) -> list[Finding]:
        """The latest revision of every finding still held (for reports and tests)."""
        return [
            render(key, workflow, episode, episode.revision)
            for key, workflow in self.states.items()
            for episode in workflow.episodes.values()
            if episode.revision
        ]

    def truncated_workflows(self) -> list[str]:
        """Workflows whose evidence a cap cut: their verdicts may be incomplete."""
        return sorted(key for key, workflow in self.states.items() if workflow.cut)

    def open_findings(self) -> dict[Severity, int]:
        """Published findings still open, by severity. Exact once `advance` has run: its first
        pass finds every open finding, and it watches them from then on."""
        counts = dict.fromkeys(Severity, 0)
        for episode in self._open_published():
            counts[episode.severity] += 1
        return counts

    def oldest_open_findings(self) -> dict[Severity, float]:
        """When the oldest published finding still open went open, by severity, on the clock
        the caller passed as `at`. A severity is left out when no finding of it is open, or
        none whose opening time is known (see `FindingStats`). As exact as `open_findings`."""
        oldest: dict[Severity, float] = {}
        for episode in self._open_published():
            at = episode.opened_at
            if at is not None:
                then = oldest.get(episode.severity)
                if then is None or at < then:
                    oldest[episode.severity] = at
        return oldest

    def _open_published(self) -> Iterator[Episode]:
        for key in self._settler.watched:
            workflow = self.states.get(key)
            for episode in () if workflow is None else workflow.episodes.values():
                if episode.revision and episode.status is Status.OPEN:
                    yield episode
