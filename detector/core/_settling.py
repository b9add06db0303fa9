"""Settling a finding: its status and severity recomputed from its episode, and a revision
published only when the document changed; with the counts a change of status makes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from detector.contracts.findings import Finding, Severity, Status

from ._counts import Counters, FindingStats
from ._deadlines import Deadlines
from ._render import render, severity_of
from ._rules import fenced
from ._state import Episode, WorkflowState
from ._takeover import place


@dataclass(frozen=True, slots=True)
class FindingUpdate:
    """One new revision of one finding, ready to publish keyed by its workflow."""

    finding: Finding
    # The finding's first revision at its severity: opened, or raised to it. What pages is a
    # finding reaching critical, which is most often a revision after the first.
    escalated: bool = False

    @property
    def workflow_key(self) -> str:
        return self.finding.workflow_key


@dataclass(slots=True)
class Settler:
    """Settles the episodes an event or the passing of time touched."""

    counters: Counters
    finding_stats: FindingStats
    deadlines: Deadlines
    # Workflows with an open finding, for `Detector.open_findings`. Not persisted: the first
    # `advance` of a detector sweeps everything and finds them again.
    watched: set[str] = field(default_factory=set)

    def watch(self, key: str, workflow: WorkflowState | None) -> None:
        """Keep `watched` to the workflows with an open finding."""
        if workflow is not None and any(
            episode.status is Status.OPEN for episode in workflow.episodes.values()
        ):
            self.watched.add(key)
        else:
            self.watched.discard(key)

    def settle_all(
        self, key: str, workflow: WorkflowState, at: float | None, episodes: list[Episode]
    ) -> list[FindingUpdate]:
        """Settle each episode once, in order; then watch and schedule the workflow anew (what a
        late acquisition must be to rename a finding is kept with it: `_takeover.place`)."""
        updates: list[FindingUpdate] = []
        quiet_period = self.deadlines.quiet_period_s
        reach = workflow.reach
        once_each = {id(episode): episode for episode in episodes}  # in order
        for episode in once_each.values():
            quiet = (
                at is not None
                and episode.last_stale_at is not None
                and at - episode.last_stale_at >= quiet_period
            )
            update = self.settle(key, workflow, episode, quiet, at)
            if update is not None:
                updates.append(update)
            if reach is not None:
                place(workflow, reach, episode)
        if updates:  # an episode opens only with a revision
            self.watch(key, workflow)
        self.deadlines.schedule(key, workflow, at)
        return updates

    def settle(
        self, key: str, workflow: WorkflowState, episode: Episode, quiet: bool, at: float | None
    ) -> FindingUpdate | None:
        """Recompute status and severity; publish a revision only when the document changed.
        `at` is the caller's clock, for `FindingStats` only."""
        if not episode.total and not episode.keys_over:
            return None
        published = episode.severity if episode.revision else None
        was = episode.status if episode.revision else None  # the published status
        worst = max(
            (severity_of(c) for c in episode.listed.values()),
            key=lambda s: s.rank,
            default=Severity.WARNING,
        )
        if worst.rank > episode.severity.rank:
            episode.severity = worst
        episode.status = Status.RESOLVED if resolved(workflow, episode, quiet) else Status.OPEN
        inputs = (episode.changes, episode.status, episode.severity, episode.truncated)
        if inputs == episode.rendered:
            return None  # nothing the document is made of changed since it was last made
        episode.rendered = inputs
        finding = render(key, workflow, episode, episode.revision + 1)
        digest = _digest(finding)
        if digest == episode.digest:
            return None
        if episode.revision == 0:
            self.counters.findings_opened += 1
        episode.digest = digest
        episode.revision += 1
        self.counters.revisions += 1
        if episode.status is not was:
            self._status_changed(episode, finding, at)
        escalated = published is None or episode.severity.rank > published.rank
        return FindingUpdate(finding, escalated)

    def _status_changed(self, episode: Episode, finding: Finding, at: float | None) -> None:
        """A revision that opens, reopens or resolves a finding: what `FindingStats` and the age
        of open findings need. Once per change of status, never per event."""
        if episode.status is Status.OPEN:
            episode.opened_at = at
            return
        stats = self.finding_stats
        severity = episode.severity
        opened = episode.opened_at
        if opened is not None and at is not None:
            stats.resolution[severity].add(max(at - opened, 0.0))
        episode.opened_at = None  # while resolved: one float less in the state
        lag = finding.evidence_lag
        if lag is not None:
            if lag.seconds is not None:
                stats.zombie_seconds[severity].add(lag.seconds)
            if lag.seq is not None and finding.ordering == "authoritative_seq":
                stats.zombie_seq[severity].add(lag.seq)


def resolved(workflow: WorkflowState, episode: Episode, quiet: bool) -> bool:
    """Known fenced (or quiet) and every affected effect key verified after its latest
    condition; never by retrying."""
    if episode.pending or episode.dup_pending or episode.keys_over:
        return False
    stale = episode.stale
    return (
        episode.retry or stale is None or quiet or fenced(workflow, episode.displaced_epoch, stale)
    )


def hinges_on_silence(workflow: WorkflowState, episode: Episode) -> bool:
    """Does the status depend on the quiet period alone (verified, not otherwise fenced)?"""
    stale = episode.stale
    return (
        not (episode.pending or episode.dup_pending or episode.keys_over or episode.retry)
        and stale is not None
        and not fenced(workflow, episode.displaced_epoch, stale)
    )


def _digest(finding: Finding) -> int:
    body = finding.model_dump_json(exclude={"revision"}).encode()
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "big")
