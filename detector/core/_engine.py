"""The engine: feed it events in arrival order, get finding revisions back.

It holds no clock: callers pass `at`, their notion of now (a record timestamp, or the event-time
watermark of a file), used only for quiet periods and eviction. Order is decided by `seq`, or by
arrival when an event has none.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from enum import StrEnum
from operator import itemgetter
from sys import intern
from typing import Final

from detector.events import Kind, OwnershipEvent, Source
from detector.findings import Finding, Severity, Status

from ._lease import LeaseHealth
from ._records import Acq, Cond, Ev, order_key
from ._render import render, severity_of
from ._rules import derive, fenced_after, verified_after, worker_of
from ._state import EFFECT_EVIDENCE, LIST_FROM, Episode, Evidence, WorkflowState, evidence_of

_VALUE: Final[dict[StrEnum, str]] = {m: m.value for m in (*Kind, *Source)}
_COMMITTED_VALUE: Final = Kind.EFFECT_COMMITTED.value  # as retained records hold it
# Members bound once: reading one off its enum class goes through the metaclass (70 ns).
_ACQUIRED: Final = Kind.LEASE_ACQUIRED
_HEARTBEAT: Final = Kind.HEARTBEAT
_RELEASED: Final = Kind.LEASE_RELEASED
_COMMIT: Final = Kind.EFFECT_COMMITTED
_EFFECT_KEY_OF: Final = itemgetter(6)
_EPOCH_OF: Final = itemgetter(2)
_MAX_SHARED_LEASES: Final = 1024
# NamedTuple's generated __new__ runs Python code; building from a tuple is twice as fast.
_new_record: Final = tuple.__new__


@dataclass(frozen=True, slots=True)
class Config:
    """Bounds and policies. Caps trade memory for how late evidence may arrive and still count."""

    max_evidence: int = 32
    max_acquisitions: int = 16
    quiet_period_s: float = 600.0
    idle_ttl_s: float = 7 * 24 * 3600.0
    # `advance` looks at every workflow only this often (event time); in between, only at
    # workflows with an open finding or a release, so a tick costs little at millions of states.
    idle_sweep_s: float = 3600.0
    missed_heartbeats: int = 2
    jitter_reserve_s: float = 5.0


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
class Counters:
    events: int = 0
    redelivered: int = 0
    # Forgotten at the caps: activity is routine for long workflows; a forgotten effect or
    # acquisition can hide a duplicate or a late displacement.
    activity_dropped: int = 0
    effects_dropped: int = 0
    acquisitions_dropped: int = 0
    evicted_released: int = 0
    evicted_idle: int = 0
    revisions: int = 0
    findings_opened: int = 0


@dataclass(slots=True)
class Detector:
    """Per-workflow state lives in `states`: a dict here, a changelog-backed table in a worker."""

    config: Config = field(default_factory=Config)
    states: MutableMapping[str, WorkflowState] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    lease_health: LeaseHealth = field(init=False)
    watermark: float | None = None
    # Workflows `advance` changed in place or removed; the owner persists them, then clears it.
    changed: set[str] = field(default_factory=set, init=False)
    _lease_values: dict[float, float] = field(default_factory=dict, init=False, repr=False)
    # Workflows `advance` must look at between sweeps: an open finding, or a release. Not
    # persisted: the first `advance` of a detector sweeps everything and finds them again.
    _watched: set[str] = field(default_factory=set, init=False, repr=False)
    _swept_at: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.lease_health = LeaseHealth(self.config.missed_heartbeats, self.config.jitter_reserve_s)

    def observe(  # noqa: PLR0915 (one frame on purpose: a call costs as much as a step)
        self, event: OwnershipEvent, at: float | None = None
    ) -> list[FindingUpdate]:
        """Account for one event; return the finding revisions it causes (usually none).

        `at` is the caller's now (a record timestamp); without it the event's own `observed_at`
        advances the watermark. The common case — the current owner reporting in order —
        stays in this method and is written for speed: it runs for every event.
        """
        self.counters.events += 1
        observed = event.observed_at
        obs = None if observed is None else observed.timestamp()
        tick = obs if at is None else at
        now = self.watermark
        if tick is not None and (now is None or tick > now):
            self.watermark = now = tick
        if now is None:
            now = 0.0
        key = event.workflow_key
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = WorkflowState()
        seq = event.seq
        # Past every seq seen: neither a redelivery nor before anything retained.
        advanced = False
        if seq is not None and seq > st.max_seq:
            st.max_seq = seq
            advanced = True
        elif st.seen(event.event_id):
            self.counters.redelivered += 1
            return []
        st.pos += 1
        st.last_at = now
        kind = event.kind
        epoch = event.owner_epoch
        if kind is _ACQUIRED:
            self._acquire(st, event, obs)
            # An acquisition after everything retained displaces none of it.
            if not (
                st.episodes
                or (not advanced and min(map(_EPOCH_OF, st.evidence), default=epoch) < epoch)
            ):
                return []
            return self._reevaluate(key, st, now, None)
        trace = event.trace_id
        ev = _new_record(
            Ev,
            (
                event.event_id,
                _VALUE[kind],
                epoch,
                seq,
                st.pos,
                _VALUE[event.source],
                event.effect_key,
                intern(event.worker_id),
                obs,
                None if trace is None else f"{trace}-{event.span_id or ''}",
            ),
        )
        kept = st.evidence
        if isinstance(kept, list):
            kept.append(ev)
        elif len(kept) + 1 < LIST_FROM:
            kept = st.evidence = (*kept, ev)
        else:
            kept = st.evidence = [*kept, ev]
        if len(kept) > self.config.max_evidence:
            kept = st.evidence = self._forget(kept)
        acqs = st.acqs
        if acqs and epoch < acqs[-1].epoch:
            return self._reevaluate(key, st, now, ev)
        if kind is _HEARTBEAT:
            if obs is not None:
                last = st.hb_obs
                st.hb_obs = obs
                lease = st.lease_s
                if (
                    last is not None
                    and lease is not None
                    and obs > last
                    and obs - last + self.config.jitter_reserve_s >= lease
                ):
                    self.lease_health.near_expiry(st.tool_class, obs - last, lease)
            return []
        if kind is _RELEASED:
            st.released_at = now
            self._watched.add(key)
            return []
        if kind is _COMMIT:
            if st.episodes or _committed_before(kept, ev):
                return self._reevaluate(key, st, now, ev)
        elif kind in EFFECT_EVIDENCE and st.episodes:
            return self._reevaluate(key, st, now, ev)
        return []

    def advance(self, now: float) -> list[FindingUpdate]:
        """Let time pass: resolve episodes whose displaced owner went quiet; evict idle state.

        Idle workflows are found by a sweep of every state at most every `idle_sweep_s`, so one
        is evicted between `idle_ttl_s` and `idle_ttl_s + idle_sweep_s` after its last event.
        """
        now = self._tick(now)
        updates: list[FindingUpdate] = []
        cfg = self.config
        sweep = self._swept_at is None or now - self._swept_at >= cfg.idle_sweep_s
        if sweep:
            self._swept_at = now
        for key in list(self.states) if sweep else list(self._watched):
            st = self.states.get(key)
            if st is None:
                self._watched.discard(key)
                continue
            if any(ep.status is Status.OPEN for ep in st.episodes.values()):
                updates.extend(self._reevaluate(key, st, now, None))
                self.changed.add(key)
            idle = sweep and st.last_at is not None and now - st.last_at >= cfg.idle_ttl_s
            released = (
                st.released_at is not None
                and now - st.released_at >= cfg.quiet_period_s
                and all(ep.status is Status.RESOLVED for ep in st.episodes.values())
            )
            due = released or idle
            if due and not st.episodes:
                del self.states[key]
                self._watched.discard(key)
            elif due and st.evidence:
                # A finding's revisions must never restart, so its workflow is compacted, not
                # forgotten: acquisitions and episodes stay, the evidence goes.
                st.evidence = ()
                st.released_at = None
                self._watch(key, st)
            else:
                self._watch(key, st)
                continue
            self.changed.add(key)
            if idle:
                self.counters.evicted_idle += 1
            else:
                self.counters.evicted_released += 1
        return updates

    def findings(self) -> list[Finding]:
        """The latest revision of every finding still held (for reports and tests)."""
        return [
            render(key, st, ep, ep.revision)
            for key, st in self.states.items()
            for ep in st.episodes.values()
            if ep.revision
        ]

    def open_findings(self) -> dict[Severity, int]:
        """Published findings still open, by severity. Exact once `advance` has run: its first
        pass finds every open finding, and it watches them from then on."""
        counts = dict.fromkeys(Severity, 0)
        for key in self._watched:
            st = self.states.get(key)
            for ep in () if st is None else st.episodes.values():
                if ep.revision and ep.status is Status.OPEN:
                    counts[ep.severity] += 1
        return counts

    def _watch(self, key: str, st: WorkflowState) -> None:
        if st.released_at is not None or any(
            ep.status is Status.OPEN for ep in st.episodes.values()
        ):
            self._watched.add(key)
        else:
            self._watched.discard(key)

    def _tick(self, at: float | None) -> float:
        if at is not None and (self.watermark is None or at > self.watermark):
            self.watermark = at
        return self.watermark if self.watermark is not None else 0.0

    def _acquire(self, st: WorkflowState, event: OwnershipEvent, obs: float | None) -> None:
        acq = _new_record(
            Acq,
            (event.owner_epoch, event.seq, st.pos, event.event_id, intern(event.worker_id), obs),
        )
        # A tuple, sorted by epoch: acquisitions are rare, and a tuple is smaller than a list.
        acqs = st.acqs
        if not acqs or acq.epoch > acqs[-1].epoch:
            acqs = (*acqs, acq)  # the usual case: a takeover by a new, higher epoch
        else:
            listed = list(acqs)
            i = bisect.bisect_left([a.epoch for a in listed], acq.epoch)
            if i < len(listed) and listed[i].epoch == acq.epoch:
                if order_key(acq) < order_key(listed[i]):
                    listed[i] = acq
            else:
                listed.insert(i, acq)
            acqs = tuple(listed)
        if len(acqs) > self.config.max_acquisitions:
            acqs = acqs[1:]
            self.counters.acquisitions_dropped += 1
        st.acqs = acqs
        if acq.epoch >= st.top:
            tool_class = (event.attrs or {}).get("tool_class")
            tool_class = None if tool_class is None else intern(tool_class)
            st.tool_class = tool_class
            st.lease_s = self._shared_lease(event.lease_duration_s)
            st.hb_obs = obs
            st.released_at = None
            self.lease_health.acquired(
                tool_class, event.lease_duration_s, event.heartbeat_interval_s
            )

    def _shared_lease(self, lease_s: float | None) -> float | None:
        """Deployments use a handful of lease durations: one float object each, not one per
        workflow."""
        if lease_s is None:
            return None
        shared = self._lease_values.get(lease_s)
        if shared is not None:
            return shared
        if len(self._lease_values) < _MAX_SHARED_LEASES:
            self._lease_values[lease_s] = lease_s
        return lease_s

    def _forget(self, kept: Evidence) -> Evidence:
        """Over the cap, forget the oldest activity first, effects last.

        A quarter at once: one pass per cap/4 events instead of a scan per event.
        """
        cap = self.config.max_evidence
        excess = len(kept) - (cap - cap // 4)
        activity = 0
        keep: list[Ev] = []
        for e in kept:
            if activity < excess and e.kind not in EFFECT_EVIDENCE:
                activity += 1
            else:
                keep.append(e)
        self.counters.activity_dropped += activity
        self.counters.effects_dropped += excess - activity
        return evidence_of(keep[excess - activity :])

    def _reevaluate(
        self, key: str, st: WorkflowState, now: float, trigger: Ev | None
    ) -> list[FindingUpdate]:
        """Merge what the evidence supports into the episodes: all of it after an acquisition
        or a pass of time (`trigger` None), else what the triggering event adds."""
        derived = derive(st, trigger)
        updates: list[FindingUpdate] = []
        for ep_key in {*derived, *st.episodes}:
            ep = st.episode(ep_key)
            found = derived.get(ep_key)
            if ep.worker is None:
                # Kept with the episode: the evidence naming the owner may be dropped later.
                ep.worker = worker_of(st, ep.displaced_epoch)
            fresh = False
            if found is not None:
                grew = _merge(ep, found.conditions)
                for ev in found.stale:
                    if ep.last_stale is None or order_key(ev) > order_key(ep.last_stale):
                        ep.last_stale = ev
                fresh = grew or (trigger is not None and trigger in found.stale)
                if fresh:
                    ep.last_stale_at = now
            update = self._settle(key, st, ep, now, fresh)
            if update is not None:
                updates.append(update)
        if updates:  # an episode opens only with a revision; `advance` drops what is settled
            self._watched.add(key)
        return updates

    def _settle(
        self, key: str, st: WorkflowState, ep: Episode, now: float, fresh: bool
    ) -> FindingUpdate | None:
        """Recompute status and severity; publish a revision only when the document changed."""
        conds = list(ep.conditions.values())
        if not conds:
            return None
        # A severity change always changes the document, so this is the last published one.
        published = ep.severity if ep.revision else None
        worst = max((severity_of(c) for c in conds), key=lambda s: s.rank)
        if worst.rank > ep.severity.rank or ep.revision == 0:
            ep.severity = worst if worst.rank >= ep.severity.rank else ep.severity
        # Once resolved, only fresh stale evidence reopens: evidence that aged out changes nothing.
        if ep.status is not Status.RESOLVED or fresh:
            ep.status = Status.RESOLVED if self._resolved(st, ep, now) else Status.OPEN
        inputs = hash(
            (
                tuple(ep.conditions.items()),
                ep.last_stale,
                ep.status,
                ep.severity,
                ep.worker,
                st.acqs,
            )
        )
        if inputs == ep.inputs:
            return None
        ep.inputs = inputs
        finding = render(key, st, ep, ep.revision + 1)
        digest = _digest(finding)
        if digest == ep.digest:
            return None
        if ep.revision == 0:
            self.counters.findings_opened += 1
        ep.digest = digest
        ep.revision += 1
        self.counters.revisions += 1
        escalated = published is None or ep.severity.rank > published.rank
        return FindingUpdate(finding, escalated)

    def _resolved(self, st: WorkflowState, ep: Episode, now: float) -> bool:
        if not ep.retry and ep.last_stale is not None:
            quiet = ep.last_stale_at is not None and now - ep.last_stale_at >= (
                self.config.quiet_period_s
            )
            if not quiet and not fenced_after(st, ep.displaced_epoch, ep.last_stale):
                return False
        latest: dict[str, Cond] = {}
        for c in ep.conditions.values():
            if c.effect_key is not None and (
                c.effect_key not in latest or order_key(c) > order_key(latest[c.effect_key])
            ):
                latest[c.effect_key] = c
        return all(verified_after(st, k, c) for k, c in latest.items())


def _committed_before(evidence: Evidence, ev: Ev) -> bool:
    """Was this effect key committed by another event already? (Duplicates need a second look.)"""
    effect_key = ev.effect_key
    if list(map(_EFFECT_KEY_OF, evidence)).count(effect_key) < 2:
        return False  # the usual case: no other event names the key (a scan at C speed)
    for e in evidence:
        if e.effect_key == effect_key and e.kind == _COMMITTED_VALUE and e is not ev:
            return True
    return False


def _merge(ep: Episode, conds: list[Cond]) -> bool:
    """Keep the earliest witness of each (kind, effect key, cause); say whether anything changed."""
    changed = False
    for c in conds:
        k = (c.kind.value, c.effect_key, c.cause)
        old = ep.conditions.get(k)
        confirmed = c.source == Source.DESTINATION or (
            old is not None and old.source == Source.DESTINATION
        )
        if old is None or _witness_rank(c) < _witness_rank(old):
            ep.conditions[k] = c
            changed = True
        # The witness is the earliest event; confirmation by a destination is any of them.
        best = ep.conditions[k]
        if confirmed and best.source != Source.DESTINATION:
            ep.conditions[k] = best._replace(source=Source.DESTINATION.value)
            changed = True
    return changed


def _witness_rank(c: Cond) -> tuple[tuple[int, int, str], tuple[int, ...]]:
    """Earliest event first; one commit can witness duplicates with several epochs: lowest wins."""
    return (order_key(c), c.epochs or ())


def _digest(finding: Finding) -> int:
    body = finding.model_dump_json(exclude={"revision"}).encode()
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "big")
