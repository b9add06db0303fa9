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

    def watch(self, key: str, st: WorkflowState | None) -> None:
        """Keep `watched` to the workflows with an open finding."""
        if st is not None and any(ep.status is Status.OPEN for ep in st.episodes.values()):
            self.watched.add(key)
        else:
            self.watched.discard(key)

    def settle_all(
        self, key: str, st: WorkflowState, at: float | None, episodes: list[Episode]
    ) -> list[FindingUpdate]:
        updates: list[FindingUpdate] = []
        q = self.deadlines.quiet_period_s
        reach = st.reach
        for ep in {id(ep): ep for ep in episodes}.values():  # once each, in order
            quiet = at is not None and ep.last_stale_at is not None and at - ep.last_stale_at >= q
            update = self.settle(key, st, ep, quiet, at)
            if update is not None:
                updates.append(update)
            if reach is not None:
                place(st, reach, ep)
        if updates:  # an episode opens only with a revision
            self.watch(key, st)
        self.deadlines.schedule(key, st, at)
        return updates

    def settle(
        self, key: str, st: WorkflowState, ep: Episode, quiet: bool, at: float | None
    ) -> FindingUpdate | None:
        """Recompute status and severity; publish a revision only when the document changed.
        `at` is the caller's clock, for `FindingStats` only."""
        if not ep.total and not ep.keys_over:
            return None
        published = ep.severity if ep.revision else None
        was = ep.status if ep.revision else None  # the published status
        worst = max(
            (severity_of(c) for c in ep.listed.values()),
            key=lambda s: s.rank,
            default=Severity.WARNING,
        )
        if worst.rank > ep.severity.rank:
            ep.severity = worst
        ep.status = Status.RESOLVED if resolved(st, ep, quiet) else Status.OPEN
        inputs = (ep.changes, ep.status, ep.severity, ep.truncated)
        if inputs == ep.rendered:
            return None  # nothing the document is made of changed since it was last made
        ep.rendered = inputs
        finding = render(key, st, ep, ep.revision + 1)
        digest = _digest(finding)
        if digest == ep.digest:
            return None
        if ep.revision == 0:
            self.counters.findings_opened += 1
        ep.digest = digest
        ep.revision += 1
        self.counters.revisions += 1
        if ep.status is not was:
            self._status_changed(ep, finding, at)
        escalated = published is None or ep.severity.rank > published.rank
        return FindingUpdate(finding, escalated)

    def _status_changed(self, ep: Episode, finding: Finding, at: float | None) -> None:
        """A revision that opens, reopens or resolves a finding: what `FindingStats` and the age
        of open findings need. Once per change of status, never per event."""
        if ep.status is Status.OPEN:
            ep.opened_at = at
            return
        stats = self.finding_stats
        severity = ep.severity
        opened = ep.opened_at
        if opened is not None and at is not None:
            stats.resolution[severity].add(max(at - opened, 0.0))
        ep.opened_at = None  # while resolved: one float less in the state
        lag = finding.evidence_lag
        if lag is not None:
            if lag.seconds is not None:
                stats.zombie_seconds[severity].add(lag.seconds)
            if lag.seq is not None and finding.ordering == "authoritative_seq":
                stats.zombie_seq[severity].add(lag.seq)


def resolved(st: WorkflowState, ep: Episode, quiet: bool) -> bool:
    """Known fenced (or quiet) and every affected effect key verified after its latest
    condition; never by retrying."""
    if ep.pending or ep.dup_pending or ep.keys_over:
        return False
    stale = ep.stale
    return ep.retry or stale is None or quiet or fenced(st, ep.displaced_epoch, stale)


def hinges_on_silence(st: WorkflowState, ep: Episode) -> bool:
    """Does the status depend on the quiet period alone (verified, not otherwise fenced)?"""
    stale = ep.stale
    return (
        not (ep.pending or ep.dup_pending or ep.keys_over or ep.retry)
        and stale is not None
        and not fenced(st, ep.displaced_epoch, stale)
    )


def _digest(finding: Finding) -> int:
    body = finding.model_dump_json(exclude={"revision"}).encode()
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "big")
