"""The engine: feed it events in arrival order, get finding revisions back.

It holds no clock. A worker passes `at`, its processing time, and measures silence on it; `audit`
passes nothing, and `finish` measures silence on each workflow's own believed times. Order is
decided by `seq`, or by arrival when an event has none.

`observe` runs for every event, so its common case is written for speed. The tricks, and the
benchmark line that shows each (`bench/bench_engine.py` "detection alone" and "memory" unless
named otherwise):
- records are tuples built with `tuple.__new__` (`new_record`), not the NamedTuple constructor;
- a workflow's raw events are a tuple while short and a list from 8 on (`LIST_FROM`);
- worker ids are interned and lease durations shared, one object each;
- seen ids are scanned at C speed (`map` + `in`) until a workflow outgrows a scan;
- cut flags are plain ints on the hot path, not `IntFlag` operations;
- the current owner's activity and attempts return before the compact state is touched;
- a finding's lists are bounded, so a revision costs the same at any size
  (`bench/bench_growth.py`);
- the `splitbrain` command raises the garbage collector's first threshold
  (`detector/gc_tuning.py`; the bench prints both settings).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from heapq import heappop, heappush
from itertools import islice
from math import isnan
from operator import itemgetter
from sys import intern
from typing import Any, ClassVar, Final, Protocol, runtime_checkable

from detector.contracts.events import Kind, OwnershipEvent, Source
from detector.contracts.findings import ConditionKind, Finding, Severity, Status

from ._clock import believe
from ._context import context_of
from ._episode import BIT, add_condition, replace_duplicate, verify
from ._labels import MAX_LABEL_VALUES, LabelBounds
from ._lease import LeaseHealth
from ._reach import ALWAYS, NEVER, Reach
from ._records import (
    ACQ_EPOCH,
    ACQ_ID,
    ACQUISITION,
    EVENT_ID,
    NONE,
    RETAINED,
    AcquisitionRecord,
    ConditionRecord,
    EventRecord,
    Latest,
    acq_print,
    after,
    any_after,
    before,
    earlier,
    ev_print,
    extend,
    fingerprint,
    later,
    mark,
    marks,
    raw_acquisition,
    union,
)
from ._render import render, severity_of
from ._rules import (
    EFFECT_OCCURRENCES,
    STALE_CONDITION,
    acquisition,
    add_fence,
    after_takeover,
    appended,
    current_owner_before,
    displaced,
    dropped_first,
    fenced,
    inserted,
    replaced,
)
from ._state import (
    LIST_FROM,
    Cut,
    Effect,
    Episode,
    EpisodeKey,
    Evidence,
    WorkflowState,
    acquisitions_of,
    evidence_of,
    forget_packed,
)

_VALUE: Final[dict[StrEnum, str]] = {m: m.value for m in (*Kind, *Source)}
_ACQUIRED: Final = Kind.LEASE_ACQUIRED
_ACQUIRED_VALUE: Final = _ACQUIRED.value
_HEARTBEAT: Final = Kind.HEARTBEAT.value
_RELEASED: Final = Kind.LEASE_RELEASED.value
_COMMITTED: Final = Kind.EFFECT_COMMITTED.value
_VERIFIED: Final = Kind.OUTCOME_VERIFIED.value
_LOST: Final = Kind.LEASE_LOST.value
_UNCERTAIN: Final = Kind.OWNERSHIP_UNCERTAIN.value
_FENCES: Final = frozenset({_LOST, _RELEASED})
# `Effect.lasts` slots of a commit, one per source (`_keep_last`).
_COMMIT_SLOTS: Final = tuple(f"{_COMMITTED}:{source.value}" for source in Source)
_FAILOVER_BIT: Final = BIT[(ConditionKind.DUPLICATE_EFFECT, "failover")]
# Findings an acquisition looks at one by one (`_moved_by`) before they get a `Reach`: most
# workflows have one or two, and a trie per workflow would cost more memory than it saves time.
_SCAN_FINDINGS: Final = 8
# Kinds lease health looks at (acquisitions apart).
_LEASE_KINDS: Final = frozenset({_HEARTBEAT, _RELEASED, _LOST, _UNCERTAIN})
_REJECTED: Final = Kind.EFFECT_REJECTED.value
_DESTINATION: Final = Source.DESTINATION.value
_VERIFIER: Final = Source.VERIFIER.value
_ACTIVITY_KINDS: Final = frozenset({_HEARTBEAT, Kind.PROGRESS.value})
# Kinds whose record keeps its event's context: acquisitions, and what can be a condition.
_CONTEXT_KINDS: Final = frozenset({_ACQUIRED_VALUE, *STALE_CONDITION})
# Kinds that change the compact state whoever sends them (the rest only when displaced).
_COMPACT_KINDS: Final = frozenset({_COMMITTED, _REJECTED, _VERIFIED, *_FENCES})
_IDS_FROM: Final = LIST_FROM  # records a workflow holds before its ids get an index
# Cuts that can hide a finding that does not exist yet: counted as truncated workflows.
_HIDING: Final = int(Cut.ACQUISITIONS | Cut.EFFECT_KEYS)
# Plain ints on the hot path: an IntFlag operation goes through the enum machinery (1 µs).
_IDS_CUT: Final = int(Cut.EVENT_IDS)
# NamedTuple's generated __new__ runs Python code; building from a tuple is twice as fast
# (`new_record(EventRecord, values) == EventRecord(*values)`, pinned by a test).
new_record: Final = tuple.__new__
_SEQ: Final = itemgetter(EventRecord._fields.index("seq"))


# The findings topic's retention (topics/topics.yaml, 14 days) and one segment's roll (1 day
# there): a record is deleted with its segment, at most one roll after its retention.
FINDINGS_VISIBLE_S: Final = 15 * 24 * 3600.0


class Bound(StrEnum):
    """The least value an engine setting takes: caps and counts below 1, and periods of 0, would
    make the engine forget or decide at once. The worker's flag takes its form from it."""

    AT_LEAST_ONE = "be at least 1"
    MORE_THAN_ZERO = "be more than 0"
    NOT_NEGATIVE = "not be negative"

    def allows(self, value: float) -> bool:
        if self is Bound.AT_LEAST_ONE:
            return value >= 1
        return value > 0 if self is Bound.MORE_THAN_ZERO else value >= 0


def _setting(default: Any, bound: Bound, meaning: str) -> Any:
    """A `Config` field, declared once: its default, its bound (checked here, and by the worker's
    flag) and its meaning (the flag's help and the configuration reference)."""
    return field(default=default, metadata={"bound": bound, "meaning": meaning})


@dataclass(frozen=True, slots=True)
class Config:
    """Bounds and policies. Caps bound memory; when one cuts evidence a verdict may depend on,
    the verdict says so (`evidence_truncated`).

    Each field is also a `splitbrain worker` flag and variable (`detector.cli.worker` makes them
    from these fields), so an engine setting is added here and nowhere else."""

    max_evidence: int = _setting(
        32,
        Bound.AT_LEAST_ONE,
        "raw events kept per workflow for a late acquisition to look back at",
    )
    max_acquisitions: int = _setting(16, Bound.AT_LEAST_ONE, "acquisitions kept per workflow")
    max_effect_keys: int = _setting(
        256, Bound.AT_LEAST_ONE, "effect keys kept per workflow and tracked per finding"
    )
    max_event_ids: int = _setting(
        256, Bound.AT_LEAST_ONE, "event ids remembered per workflow to recognise a redelivery"
    )
    quiet_period_s: float = _setting(
        600.0,
        Bound.MORE_THAN_ZERO,
        "silence (this worker's clock) that counts as fenced, in seconds",
    )
    clock_skew_s: float = _setting(
        3600.0,
        Bound.MORE_THAN_ZERO,
        "audit only: how far ahead an uncorroborated observed_at is still believed, in seconds",
    )
    idle_ttl_s: float = _setting(
        7 * 24 * 3600.0,
        Bound.MORE_THAN_ZERO,
        "a workflow with no events for this long is forgotten, in seconds",
    )
    # `advance` looks at every workflow only this often; in between, only at workflows with an
    # open finding or a release, so a tick costs little at millions of states.
    idle_sweep_s: float = _setting(
        3600.0, Bound.NOT_NEGATIVE, "how often every workflow is checked for idleness, in seconds"
    )
    # A remnant (`WorkflowState.remnant`) is removed this long after it was made: by then no
    # reader of the findings topic can still see its findings' revisions, so a finding of its
    # workflow may start again at revision 1 (README "Forgotten workflows"). A day of margin.
    remnant_ttl_s: float = _setting(
        FINDINGS_VISIBLE_S + 24 * 3600.0,
        Bound.MORE_THAN_ZERO,
        "a forgotten workflow's remnant is removed this long after it was made, in seconds; at "
        "least the findings topic's retention.ms + segment.ms, so no reader still sees the "
        "revisions of its findings",
    )
    # R and J: DESIGN §4, R=1 the practice's own example.
    missed_heartbeats: int = _setting(
        1, Bound.AT_LEAST_ONE, "R of the lease rule L > (R+1) x H + J"
    )
    jitter_reserve_s: float = _setting(
        20.0, Bound.NOT_NEGATIVE, "J of the lease rule L > (R+1) x H + J, in seconds"
    )
    max_label_values: int = _setting(
        MAX_LABEL_VALUES,
        Bound.AT_LEAST_ONE,
        "distinct values kept per lease-health metric label (tool_class, model, provider); "
        "the rest are counted as other",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or isnan(value):
                raise ValueError(f"{f.name} must be a number, not {value!r}")
            bound: Bound = f.metadata["bound"]
            if not bound.allows(value):
                raise ValueError(f"{f.name} must {bound}, not {value!r}")

    @classmethod
    def for_audit(cls, **overrides: Any) -> Config:
        """Caps that keep histories of thousands of events per workflow exact: `audit` holds
        one history, not a fleet's worth of workflows."""
        caps: dict[str, Any] = {
            "max_evidence": 100_000,
            "max_acquisitions": 10_000,
            "max_effect_keys": 100_000,
            "max_event_ids": 200_000,
        }
        return cls(**{**caps, **{k: v for k, v in overrides.items() if v is not None}})


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


@dataclass(frozen=True, slots=True)
class Advanced:
    """What letting time pass did: revisions to publish, and the workflows it changed in place
    or removed (evicted), for the owner of the states to persist."""

    updates: list[FindingUpdate]
    changed: set[str]


@dataclass(slots=True)
class Counters:
    events: int = 0
    redelivered: int = 0
    id_conflicts: int = 0  # a seen event id came again with other content
    # Forgotten at the caps: raw activity and other raw events are routine for long workflows
    # (their verdicts live on in compact form); a forgotten effect key or acquisition can hide
    # a duplicate or a late displacement.
    activity_dropped: int = 0
    events_dropped: int = 0
    effects_dropped: int = 0
    acquisitions_dropped: int = 0
    ids_dropped: int = 0
    workflows_truncated: int = 0
    times_disbelieved: int = 0
    evicted_released: int = 0
    evicted_idle: int = 0
    evicted_expired: int = 0  # remnants removed at `remnant_ttl_s`
    revisions: int = 0
    findings_opened: int = 0


# Histogram bounds of `FindingStats` (the last bucket, +Inf, is implied).
ZOMBIE_SECONDS_BOUNDS: Final = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
ZOMBIE_SEQ_BOUNDS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000)
RESOLUTION_BOUNDS: Final = (
    *(1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600),
    *(7200, 14400, 43200, 86400, 259200, 604800),
)


@dataclass(slots=True)
class Observations:
    """One histogram's observations: `counts[i]` counts the values above bound i-1 and at most
    bound i (not cumulatively), the last index those above every bound; `total` their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


def _by_severity(bounds: tuple[float, ...]) -> dict[Severity, Observations]:
    return {severity: Observations(bounds) for severity in Severity}


@dataclass(slots=True)
class FindingStats:
    """Cumulative observations of findings by the severity of the revision that made them, for
    a worker to export as metrics (`detector.telemetry.metrics`); they decide nothing. Each is
    made once per change of status, so a revision that changes nothing else costs nothing here.

    When a finding resolves (its first resolved revision, or again after a reopening):
    - `zombie_seconds` and `zombie_seq`: how long its displaced owner went on acting after the
      takeover, as the resolving revision's `evidence_lag` says: its last stale event minus the
      transition, in `observed_at` seconds (none when a time is missing or the difference is
      negative: emitters' clocks, for a metric only) and in `seq` (only with `ordering:
      authoritative_seq`). A finding without a displaced owner's stale event (a retry, a
      duplicate after a clean handoff) has none;
    - `resolution`: the caller's time (`at`, a worker's processing clock) from the revision that
      opened the finding, or reopened it, to the one that resolved it. None without `at`
      (`audit`), for a finding published resolved at once, or opened before a worker kept the
      time (a state restored from an older version).
    """

    ZOMBIE_SECONDS_BOUNDS: ClassVar = ZOMBIE_SECONDS_BOUNDS
    ZOMBIE_SEQ_BOUNDS: ClassVar = ZOMBIE_SEQ_BOUNDS
    RESOLUTION_BOUNDS: ClassVar = RESOLUTION_BOUNDS

    zombie_seconds: dict[Severity, Observations] = field(
        default_factory=lambda: _by_severity(ZOMBIE_SECONDS_BOUNDS)
    )
    zombie_seq: dict[Severity, Observations] = field(
        default_factory=lambda: _by_severity(ZOMBIE_SEQ_BOUNDS)
    )
    resolution: dict[Severity, Observations] = field(
        default_factory=lambda: _by_severity(RESOLUTION_BOUNDS)
    )


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
    # Workflows with an open finding, for `open_findings`. Not persisted, nor the schedule: the
    # first `advance` of a detector sweeps everything and finds them again.
    _watched: set[str] = field(default_factory=set, init=False, repr=False)
    # When `advance` must look at a workflow again (`_schedule`): a heap of (time, key), and
    # the earliest time each key is in it for (later entries of a key are skipped).
    _due: list[tuple[float, str]] = field(default_factory=list, init=False, repr=False)
    _due_at: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _swept_at: float | None = field(default=None, init=False, repr=False)
    # Set by a change of what every finding of a workflow is rendered from (a cut): `observe`
    # (or `advance`, for the workflow it just let time pass for) then settles them all, so that
    # no document changes without its revision. A cut happens once per kind and workflow.
    _resettle: bool = field(default=False, init=False, repr=False)
    # The findings that named an acquisition `_keep` pushed out at the cap, for `_acquired`.
    _unnamed: list[Episode] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.lease_health = LeaseHealth(
            self.config.missed_heartbeats,
            self.config.jitter_reserve_s,
            LabelBounds(self.config.max_label_values),
        )

    # ---- events ----------------------------------------------------------------------------

    def observe(self, event: OwnershipEvent, at: float | None = None) -> list[FindingUpdate]:
        """Account for one event; return the finding revisions it causes (usually none).

        `at` is a worker's processing time. Without it (`audit`), the event's believed
        `observed_at` is what silence is measured on, at `finish`.
        """
        updates = self._account(event, at)
        if self._resettle:
            updates.extend(self._resettled(event.workflow_key, at))
        return updates

    def _resettled(self, key: str, at: float | None) -> list[FindingUpdate]:
        """What `_resettle` asks for: every finding of the workflow settled again."""
        self._resettle = False
        st = self.states.get(key)
        if st is None or not st.found:
            return []
        return self._settle_all(key, st, at, list(st.episodes.values()))

    def _account(self, event: OwnershipEvent, at: float | None) -> list[FindingUpdate]:
        self.counters.events += 1
        observed = event.observed_at
        obs = None if observed is None else observed.timestamp()
        key = event.workflow_key
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = WorkflowState()
        kind = _VALUE[event.kind]
        epoch = event.owner_epoch
        seq = event.seq
        worker = intern(event.worker_id)
        effect_key = event.effect_key
        if self._seen(st, event.event_id, kind, epoch, seq, worker, effect_key):
            return []
        late = seq is not None and seq <= st.max_seq  # at one seq an acquisition is first
        # An unknown id may be a forgotten one, unless its seq is past every seq seen.
        uncertain = bool(st.cut & _IDS_CUT) and (seq is None or seq <= st.max_seq)
        if seq is not None and seq > st.max_seq:
            st.max_seq = seq
        pos = st.pos = st.pos + 1
        source = _VALUE[event.source]
        if at is not None:
            st.last_at = at
        else:
            if obs is not None:
                st.last_at = obs if st.last_at is None else max(st.last_at, obs)
            tie = ("0" if kind == _ACQUIRED_VALUE else "1") + event.event_id  # acquisitions first
            self._clock(st, seq, pos, obs, worker, source, tie)
        if kind == _ACQUIRED_VALUE:
            # What a finding's `context` shows of it (DESIGN §5) is kept with its record.
            acq = new_record(
                AcquisitionRecord,
                (
                    epoch,
                    seq,
                    pos,
                    event.event_id,
                    worker,
                    obs,
                    context_of(event.attrs, event.detail),
                ),
            )
            self._acquire(st, acq, event, late)
            return self._acquired(key, st, acq, late, at, uncertain)
        trace = event.trace_id
        ev = new_record(
            EventRecord,
            (
                event.event_id,
                kind,
                epoch,
                seq,
                pos,
                source,
                effect_key,
                worker,
                obs,
                None if trace is None else f"{trace}-{event.span_id or ''}",
                context_of(event.attrs, event.detail) if kind in _CONTEXT_KINDS else None,
            ),
        )
        self._retain(st, ev)
        if st.undisplaced is not None:
            _undisplaced(st, ev)
        if kind in _LEASE_KINDS:
            if kind == _HEARTBEAT:
                self.lease_health.heartbeat(st, epoch, obs, event)
            else:
                self._lease_event(key, st, kind, epoch, event, at)
        if kind not in _COMPACT_KINDS and not (st.acqs and epoch < st.acqs[-1].epoch):
            return []  # the usual case: the current owner's activity or attempt
        touched = self._ingest(st, ev, at, uncertain)
        return self._settle_all(key, st, at, touched) if touched else []

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
        st = self.states.get(workflow_key)
        if st is None:
            st = self.states[workflow_key] = WorkflowState()
        self._cut(st, Cut.ENGINE_ERROR)

    def _acquired(
        self,
        key: str,
        st: WorkflowState,
        acq: AcquisitionRecord,
        late: bool,
        at: float | None,
        uncertain: bool,
    ) -> list[FindingUpdate]:
        touched = self._displace(st, acq, at, uncertain) if late else []
        raw = raw_acquisition(acq)
        if st.undisplaced is not None:
            _undisplaced(st, raw)
        if _heard_from(st, raw):
            touched.extend(self._alive(st, raw, at))
        found = st.found
        if not found:
            return []
        # The findings whose owners or transition it may rename (`_renamed`), and those that
        # named an acquisition it pushed out at the cap (`_keep`). Only these are rendered again.
        moved = self._renamed(st, acq, acq.seq if late and acq.seq is not None else ALWAYS)
        for ep in moved:
            ep.changes += 1
        unnamed, self._unnamed = self._unnamed, []
        return self._settle_all(key, st, at, [*touched, *moved, *unnamed])

    def _renamed(self, st: WorkflowState, acq: AcquisitionRecord, threshold: int) -> list[Episode]:
        """The findings an acquisition may rename (their owners, their transition): its own
        epoch's, and those below its epoch whose conditions reach `threshold` (its seq when it
        is late, `_reach`); after everything else, none but its own."""
        found = st.found
        if not found:
            return []
        if st.reach is None and len(found) <= _SCAN_FINDINGS:
            return [ep for ep in found.values() if _moved_by(ep, acq)]
        moved = [found[k] for k in self._reach(st).report(acq.epoch, threshold)]
        own = found.get((acq.epoch, False))
        if own is not None:
            moved.append(own)
        return [ep for ep in moved if _moved_by(ep, acq)]

    def _reach(self, st: WorkflowState) -> Reach[EpisodeKey]:
        """The workflow's findings by what a late acquisition must be to change them (built at
        the first acquisition that finds more than `_SCAN_FINDINGS`, then kept as findings
        change: `_settle_all`)."""
        reach = st.reach
        if reach is None:
            reach = st.reach = Reach()
            for ep in st.episodes.values():
                _place(st, reach, ep)
        return reach

    def _ingest(
        self, st: WorkflowState, ev: EventRecord, at: float | None, uncertain: bool
    ) -> list[Episode]:
        """What one event adds to the compact state; the episodes it touched."""
        touched: list[Episode] = []
        kind = ev.kind
        acqs = st.acqs
        if (
            acqs
            and ev.epoch < acqs[-1].epoch
            and kind in STALE_CONDITION
            and displaced(st, ev.epoch, ev.seq, ev.pos)
        ):
            touched.append(self._stale(st, ev, at, uncertain))
        key = ev.effect_key
        if kind == _COMMITTED and key is not None:
            eff = self._effect(st, key)
            _keep_last(eff, ev)
            touched.extend(self._commit(st, eff, ev, uncertain))
        if kind in _FENCES or (kind == _REJECTED and ev.source == _DESTINATION):
            if st.fences is None:
                st.fences = {}
            points = st.fences.setdefault(ev.epoch, [])
            added = add_fence(points, ev.seq, ev.event_id, ev.pos)
            if added:
                ep = st.episodes.get((ev.epoch, False))
                if added > 1:  # fences were dropped: a status may hinge on one of them
                    ep = st.episode((ev.epoch, False))
                    ep.truncated = True
                if ep is not None:
                    touched.append(ep)
        elif kind == _VERIFIED and ev.source == _VERIFIER and key is not None:
            eff = self._effect(st, key)
            if eff.verified is None:
                eff.verified = marks()
            if mark(eff.verified, ev.seq, ev.pos, ev.event_id):
                touched.extend(ep for ep in st.episodes.values() if verify(ep, key, eff.verified))
        if _heard_from(st, ev):
            touched.extend(self._alive(st, ev, at))
        return touched

    def _alive(self, st: WorkflowState, ev: EventRecord, at: float | None) -> list[Episode]:
        """A displaced owner heard from after the takeover is alive: its silence starts again
        (DESIGN §4 "Time and silence"). Unsure of its lease, it is no fence either."""
        if st.uncertain is None:
            st.uncertain = {}
        st.uncertain[ev.epoch] = extend(st.uncertain.get(ev.epoch), ev)
        ep = st.episodes.get((ev.epoch, False))
        if ep is None:
            return []
        if at is not None:
            ep.last_stale_at = at
        return [ep]

    def _stale(
        self, st: WorkflowState, ev: EventRecord, at: float | None, uncertain: bool
    ) -> Episode:
        """Evidence of a displaced epoch after the takeover: a condition of its episode."""
        ckind = STALE_CONDITION[ev.kind]
        activity = ev.kind in _ACTIVITY_KINDS
        key = None if activity else ev.effect_key
        ep = st.episode((ev.epoch, False))
        if ep.first_stale is None or before(ev, ep.first_stale):
            ep.worker = ev.worker_id  # the first stale event's: the same in any arrival order
        cond = new_record(
            ConditionRecord,
            (ckind, ev.event_id, ev.seq, ev.pos, key, None, None, ev.source, ev.trace, None, False),
        )
        eff = None if key is None or st.effects is None else st.effects.get(key)
        add_condition(
            ep, cond, ev, None if eff is None else eff.verified, self.config.max_effect_keys
        )
        ep.first_stale = ev if ep.first_stale is None else earlier(ep.first_stale, ev)
        ep.stale = extend(ep.stale, ev)
        if at is not None:
            ep.last_stale_at = at  # the displaced owner acted: silence starts again
        if uncertain:
            ep.truncated = True
        return ep

    def _commit(
        self, st: WorkflowState, eff: Effect, ev: EventRecord, uncertain: bool
    ) -> list[Episode]:
        """Duplicates: the key committed under two epochs, or twice by one source of one."""
        touched: list[Episode] = []
        key = ev.effect_key
        assert key is not None  # a commit's key (`_ingest`)
        first = eff.firsts.get(ev.epoch)
        if first is None or before(ev, first):
            eff.firsts[ev.epoch] = ev
        if ev.source == _DESTINATION:
            if eff.confirmed is None:
                eff.confirmed = set()
            eff.confirmed.add(ev.epoch)
        cap = self.config.max_effect_keys
        # The key's duplicates are between the epochs that committed it next to each other
        # (DESIGN §4): a commit adds to at most the pair below its epoch and the pair above.
        epoch = ev.epoch
        order = eff.order
        if order is None:
            order = eff.order = sorted(eff.firsts)
        elif first is None:
            if not order or epoch > order[-1]:
                order.append(epoch)  # the usual case: the key's newest owner
            else:
                insort(order, epoch)
        i = bisect_left(order, epoch)
        below = order[i - 1] if i else None
        above = order[i + 1] if i + 1 < len(order) else None
        if below is not None:
            if first is None and above is not None:
                # An epoch between two that committed the key, arriving late: the pair of
                # those two gives way to the two pairs with it.
                touched.append(self._repartner(st, eff, key, below, epoch, above, uncertain))
            else:
                touched.append(self._duplicate(st, eff, ev, below, epoch, uncertain, cap))
        if above is not None:
            touched.append(self._duplicate(st, eff, ev, epoch, above, uncertain, cap))
        pair = eff.twice.setdefault((ev.epoch, ev.source), [])
        if all(p.event_id != ev.event_id for p in pair):
            pair.append(ev)
            if len(pair) > 1 and before(pair[-1], pair[-2]):
                pair[-1], pair[-2] = pair[-2], pair[-1]
            if len(pair) > 2 and before(pair[1], pair[0]):
                pair[0], pair[1] = pair[1], pair[0]
            del pair[2:]
        if len(pair) == 2:
            second = pair[1]
            cond = new_record(
                ConditionRecord,
                (
                    ConditionKind.DUPLICATE_EFFECT,
                    second.event_id,
                    second.seq,
                    second.pos,
                    key,
                    "retry",
                    (ev.epoch,),
                    second.source,
                    second.trace,
                    (pair[0].worker_id, second.worker_id),
                    pair[0].seq is not None and second.seq is not None,
                ),
            )
            ep = st.episode((ev.epoch, True))
            if ep.worker is None:
                ep.worker = second.worker_id
            latest = eff.lasts[(ev.epoch, f"{_COMMITTED}:{ev.source}")]
            for occurrence in dict.fromkeys((ev, pair[0], second, latest)):  # as for a failover
                add_condition(ep, cond, occurrence, eff.verified, cap)
            ep.truncated |= uncertain
            touched.append(ep)
        return touched

    def _duplicate(
        self,
        st: WorkflowState,
        eff: Effect,
        ev: EventRecord,
        lo: int,
        hi: int,
        uncertain: bool,
        cap: int,
    ) -> Episode:
        """The key committed under `lo` and under `hi`, the next epoch that committed it: a
        failover duplicate in `lo`'s episode, of which `ev` (a commit of either) occurs."""
        cond = _failover(eff, lo, hi)
        ep = st.episode((lo, False))
        if ep.worker is None:
            ep.worker = eff.firsts[lo].worker_id
        # Every commit of either epoch is an occurrence of the duplicate: without a total
        # order, the last one and what a verification must come after are among these.
        for occurrence in dict.fromkeys((ev, *_pair_commits(eff, lo, hi))):
            add_condition(ep, cond, occurrence, eff.verified, cap, dup=True)
        ep.truncated |= uncertain
        return ep

    def _repartner(
        self, st: WorkflowState, eff: Effect, key: str, lo: int, mid: int, hi: int, uncertain: bool
    ) -> Episode:
        """`mid` committed the key after `lo` and `hi` did: `lo`'s duplicate of the key is now
        with `mid`, and ends as if the pair with `hi` had never been added. A rare case (an
        out-of-order commit), bounded: constant unless `hi`'s commits were the episode's latest
        conditions, which are then gathered again from its stale events and its duplicates."""
        cond = _failover(eff, lo, mid)
        ep = st.episode((lo, False))
        commits = _pair_commits(eff, lo, mid)
        both = eff.confirmed is not None and {lo, mid} <= eff.confirmed
        replace_duplicate(ep, cond, commits, eff.verified, both)
        latest = ep.latest
        if latest is not None and (
            latest.unseq != NONE or any(_commit_of(r, hi, key) for r in (latest.top, latest.last))
        ):
            latest = ep.stale  # what the episode holds apart from its duplicates
            for k, bits in ep.keys.items():
                other = None if st.effects is None else st.effects.get(k)
                if bits & _FAILOVER_BIT and other is not None:
                    order = other.order
                    if order is None:
                        order = other.order = sorted(other.firsts)
                    j = bisect_left(order, lo) + 1
                    if j < len(order) and order[j - 1] == lo:
                        for r in _pair_commits(other, lo, order[j]):
                            latest = extend(latest, r)
        for r in commits:
            latest = extend(latest, r)
        ep.latest = latest
        ep.truncated |= uncertain
        return ep

    def _displace(
        self, st: WorkflowState, acq: AcquisitionRecord, at: float | None, uncertain: bool
    ) -> list[Episode]:
        """A late acquisition: what it displaces among what the workflow still holds. Only the
        events no acquisition displaced yet are looked at, each once: what was already stale
        stays so, and its condition is already counted."""
        touched: list[Episode] = []
        und = st.undisplaced
        reach = st.undisplaced_reach
        if und is not None and reach is not None and acq.seq is not None:
            # Only the epochs below it that hold an event at or after its seq: not every epoch.
            for epoch in sorted(reach.report(acq.epoch - 1, acq.seq)):
                kept = und[epoch]
                i = bisect_left(kept, acq.seq, key=_SEQ)  # at the takeover's seq: after it
                tail = kept[i:]
                del kept[i:]
                for ev in tail:
                    if not before(acq, ev):
                        kept.append(ev)
                    elif ev.kind in STALE_CONDITION:
                        touched.append(self._stale(st, ev, at, uncertain))
                    else:
                        touched.extend(self._alive(st, ev, at))
                if kept:
                    reach.set(epoch, epoch, kept[-1].seq or 0)
                else:
                    del und[epoch]
                    reach.discard(epoch)
        if st.forgotten is not None and any_after(st.forgotten, acq.seq, acq.pos, ACQUISITION):
            # Raw events after it are gone: the latest effects per key still tell, but other
            # stale events and earlier witnesses may be among what was forgotten.
            if acq.epoch > st.blind_below:
                # The findings of the epochs it newly blinds say their evidence may be cut:
                # a new revision each, published now (never a document changed in silence).
                for ep in st.episodes.values():
                    if not ep.retry and st.blind_below <= ep.displaced_epoch < acq.epoch:
                        ep.changes += 1
                        touched.append(ep)
                st.blind_below = acq.epoch
            for eff in (st.effects or {}).values():
                for (epoch, _), ev in list(eff.lasts.items()):
                    if epoch < acq.epoch and before(acq, ev):
                        touched.append(self._stale(st, ev, at, uncertain))
        return touched

    # ---- bounded memory ---------------------------------------------------------------------

    def _seen(
        self,
        st: WorkflowState,
        event_id: str,
        kind: str,
        epoch: int,
        seq: int | None,
        worker: str,
        key: str | None,
    ) -> bool:
        """Has this id been seen? A repeated id changes nothing, whatever it carries."""
        ids = st.ids
        if ids is None:
            old: int | None = None
            # Scans at C speed: the usual answer is "not seen", over a handful of records.
            if event_id in map(EVENT_ID, st.evidence) or event_id in map(ACQ_ID, st.acqs):
                old = RETAINED
            else:
                if len(st.evidence) + len(st.acqs) + 1 >= _IDS_FROM:
                    ids = self._index_ids(st)
                    ids[event_id] = RETAINED
                return False
        else:
            old = ids.get(event_id)
            if old is None:
                ids[event_id] = RETAINED  # every new event is retained, at first
                if len(ids) > max(self.config.max_event_ids, 8):
                    # The oldest forgotten ids go. A retained record's id stays (its record is
                    # held anyway): it is `RETAINED` exactly while a retained record holds it, so
                    # a restored state, which marks every retained record's id, equals this one.
                    forgotten = (k for k, v in ids.items() if v != RETAINED)
                    gone = list(islice(forgotten, len(ids) // 4))
                    for k in gone:
                        del ids[k]
                    if gone:
                        st.cut |= _IDS_CUT
                        self.counters.ids_dropped += len(gone)
                return False
        if old == RETAINED:
            old = _retained_print(st, event_id)
        if old == fingerprint(kind, epoch, seq, worker, key):
            self.counters.redelivered += 1
        else:
            self.counters.id_conflicts += 1
        return True

    def _index_ids(self, st: WorkflowState) -> dict[str, int]:
        """From a scan of the few records to a dict, before any of them can be forgotten."""
        if st.ids is None:
            ids = dict.fromkeys(map(ACQ_ID, st.acqs), RETAINED)
            ids.update(dict.fromkeys(map(EVENT_ID, st.evidence), RETAINED))
            st.ids = ids
        return st.ids

    def _retain(self, st: WorkflowState, ev: EventRecord) -> None:
        """Keep a raw event for a late acquisition to look back at; past the cap, forget."""
        kept = st.evidence
        if isinstance(kept, list):
            kept.append(ev)
        elif len(kept) + 1 < LIST_FROM:
            kept = st.evidence = (*kept, ev)
        else:
            kept = st.evidence = [*kept, ev]
        if len(kept) > self.config.max_evidence:
            st.evidence = self._forget(st, kept)

    def _forget(self, st: WorkflowState, kept: Evidence) -> Evidence:
        """Over the cap, forget the oldest raw events, activity first: effects, fences and
        verifications live on in compact form. A quarter at once: one pass per cap/4 events."""
        self._index_ids(st)
        cap = self.config.max_evidence
        excess = len(kept) - (cap - cap // 4)
        activity = 0
        keep: list[EventRecord] = []
        for e in kept:
            if activity < excess and e.kind in _ACTIVITY_KINDS:
                activity += 1
            else:
                keep.append(e)
        self.counters.activity_dropped += activity
        self.counters.events_dropped += excess - activity
        self._cut(st, Cut.EVIDENCE)
        gone = [e for e in kept if e.kind in _ACTIVITY_KINDS][:activity] + keep[: excess - activity]
        _pin(st, gone, ev_print)
        self._remember(st, gone)
        forget_packed(st)
        st.undisplaced = None
        return evidence_of(keep[excess - activity :])

    def _remember(self, st: WorkflowState, gone: Iterable[EventRecord]) -> None:
        """What forgetting raw events leaves: where they were (a late acquisition before any of
        them is blind), and the latest attempt, commit and rejection per key and epoch."""
        if st.forgotten is None:
            st.forgotten = marks()
        for e in gone:
            mark(st.forgotten, e.seq, e.pos, e.event_id)
            if e.effect_key is not None and e.kind in EFFECT_OCCURRENCES:
                _keep_last(self._effect(st, e.effect_key), e)

    def _effect(self, st: WorkflowState, key: str) -> Effect:
        """The key's effect, to change: its packed row is dropped (`Effect.packed`)."""
        effects = st.effects
        if effects is None:
            effects = st.effects = {}
        eff = effects.get(key)
        if eff is not None:
            eff.packed = None
        else:
            eff = effects[key] = Effect()
            if len(effects) > self.config.max_effect_keys:
                excess = max(len(effects) // 4, 1)
                for gone in list(islice(effects, excess)):
                    del effects[gone]
                self.counters.effects_dropped += excess
                self._cut(st, Cut.EFFECT_KEYS)
        return eff

    def _clock(
        self,
        st: WorkflowState,
        seq: int | None,
        pos: int,
        obs: float | None,
        worker: str,
        source: str,
        at_seq: str,
    ) -> None:
        """Audit: every event's place and time, for silence measured at `finish`."""
        clock = st.clock
        if clock is None:
            clock = st.clock = []
        clock.append((seq, pos, obs, worker, source, at_seq))
        if len(clock) > self.config.max_evidence:
            gone = len(clock) // 4
            if any(entry[2] is not None for entry in clock[:gone]):
                self._cut(st, Cut.CLOCK)  # an entry without a time says nothing of silence
            del clock[:gone]

    def _cut(self, st: WorkflowState, what: Cut) -> None:
        if what & _HIDING and not st.cut & _HIDING:
            self.counters.workflows_truncated += 1
        if int(what) & ~st.cut:
            _changed(st)
            self._resettle = True
        st.cut |= int(what)

    def _acquire(
        self, st: WorkflowState, acq: AcquisitionRecord, event: OwnershipEvent, late: bool
    ) -> None:
        """Keep the acquisition; then its lease health (`LeaseHealth.acquired`)."""
        top = st.top
        if late and st.undisplaced is None:
            _index_undisplaced(st)  # from what the acquisitions known so far displace
        new_epoch = self._keep(st, acq)
        if acq.epoch >= st.top:
            st.released_at = None  # the current epoch holds the lease again
        self.lease_health.acquired(st, acq, event, top, new_epoch)

    def _keep(self, st: WorkflowState, acq: AcquisitionRecord) -> bool:
        """Keep the acquisition in epoch order; is its epoch new? One forgotten at the cap
        changes no published finding by itself: the next revision of each says its evidence
        was cut. A new highest epoch is appended, and the staleness index extended, in
        constant time; a late one is inserted in place (`_rules.inserted`), a step or two when
        late acquisitions come newest first."""
        acqs = st.acqs
        top = acqs[-1].epoch if acqs else -1
        new_epoch = True
        if acq.epoch > top:  # the usual case: a takeover by a new, higher epoch
            if isinstance(acqs, list):
                acqs.append(acq)
            else:
                acqs = st.acqs = acquisitions_of((*acqs, acq))
            appended(st)
        else:
            listed = acqs if isinstance(acqs, list) else list(acqs)
            i = bisect_left(listed, acq.epoch, key=ACQ_EPOCH)
            if i < len(listed) and listed[i].epoch == acq.epoch:
                new_epoch = False
                kept = listed[i]
                gone = kept if before(acq, kept) else acq
                if gone is kept:
                    listed[i] = acq
                if acq.seq is not None and kept.seq is not None and acq.pos != kept.pos:
                    # The epoch is acquired before whatever either acquisition is before: by seq
                    # the earlier one, by arrival the one that came first.
                    listed[i] = listed[i]._replace(pos=min(acq.pos, kept.pos))
                if listed[i] != kept:  # a finding may name it (its transition, its owners)
                    acqs = st.acqs = acquisitions_of(listed)
                    replaced(st, i, kept)
                    _changed(st)
                    self._resettle = True
                # Folded into the other acquisition of its epoch, the one that goes stays a raw
                # event: its id is known when it comes again, however small the workflow is,
                # and after a takeover it is a sign of its owner's life.
                self._retain(st, raw_acquisition(gone))
            else:
                listed.insert(i, acq)
                if listed is not acqs:
                    acqs = st.acqs = acquisitions_of(listed)
                inserted(st, i)
        if len(acqs) > self.config.max_acquisitions:
            gone = acqs[0]
            self._index_ids(st)
            _pin(st, acqs[:1], acq_print)
            if isinstance(acqs, list) and len(acqs) > LIST_FROM:
                del acqs[0]  # a list stays a list: the shape `acquisitions_of` gives
            else:
                st.acqs = acquisitions_of(acqs[1:])
            dropped_first(st, 1)
            self.counters.acquisitions_dropped += 1
            self._cut(st, Cut.ACQUISITIONS)
            # The findings that may have named what went (its owner, a transition, a current
            # owner) are those it could rename: each is published again if its document changed.
            threshold = ALWAYS if gone.seq is None else gone.seq
            for ep in self._renamed(st, gone, threshold):
                ep.changes += 1
                self._unnamed.append(ep)
        return new_epoch

    def _lease_event(
        self,
        key: str,
        st: WorkflowState,
        kind: str,
        epoch: int,
        event: OwnershipEvent,
        at: float | None,
    ) -> None:
        """A release, lease loss or uncertain ownership (heartbeats go to `LeaseHealth` at
        once). A release of the current epoch starts its quiet period; the rest is lease
        health, which decides no verdict."""
        health = self.lease_health
        if kind == _RELEASED:
            if epoch >= st.top:
                st.released_at = st.last_at
                health.released(st)
                self._schedule(key, st, at)
        elif kind == _LOST:
            health.lost(st, event.attrs)
        else:
            health.uncertain(st, event.attrs)

    # ---- time ------------------------------------------------------------------------------

    def advance(
        self, now: float, on_error: Callable[[str, Exception], None] | None = None
    ) -> Advanced:
        """Let the worker's time pass: resolve episodes whose displaced owner went quiet; evict
        idle state. Returns the revisions to publish and the workflows to persist.

        Between sweeps only the workflows whose time is due are looked at (`_schedule`), so a
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
        cfg = self.config
        sweep = self._swept_at is None or now - self._swept_at >= cfg.idle_sweep_s
        if sweep:
            self._swept_at = now
        for key in self._swept_keys(now) if sweep else self._due_keys(now):
            try:
                self._advance_one(key, now, sweep, updates, changed)
                if self._resettle:  # compacting cut what every finding is rendered from
                    updates.extend(self._resettled(key, now))
            except Exception as exc:
                if on_error is None:
                    raise
                self.failed(key)
                self._watched.discard(key)
                self._due_at.pop(key, None)
                changed.add(key)
                on_error(key, exc)
        return Advanced(updates, changed)

    def _advance_one(
        self, key: str, now: float, sweep: bool, updates: list[FindingUpdate], changed: set[str]
    ) -> None:
        cfg = self.config
        st = self.states.get(key)
        if st is None:
            self._watched.discard(key)
            return
        open_eps = [ep for ep in st.episodes.values() if ep.status is Status.OPEN]
        if open_eps:
            resolved = self._settle_all(key, st, now, open_eps)
            if resolved:
                updates.extend(resolved)
                changed.add(key)
        if st.remnant_only:
            if st.last_at is None:
                # A remnant of a version that did not stamp it: its time starts now.
                st.last_at = now
                changed.add(key)
            # Expired: no reader can see its findings' revisions any more (`remnant_ttl_s`).
            idle = sweep and now - st.last_at >= cfg.remnant_ttl_s
        else:
            idle = sweep and st.last_at is not None and now - st.last_at >= cfg.idle_ttl_s
        settled = all(ep.status is Status.RESOLVED for ep in st.episodes.values())
        released = (
            st.released_at is not None and now - st.released_at >= cfg.quiet_period_s and settled
        )
        if not (released or idle):
            self._watch(key, st)
            self._schedule(key, st, now)
            return
        if not st.episodes and (st.past is None or idle):
            del self.states[key]
        elif idle and settled:
            # Forgotten, but its findings must not restart their revisions while a reader can
            # still see them: what their later revisions need is kept (`WorkflowState.remnant`).
            self.states[key] = st.remnant(now)
        elif st.evidence or st.ids:
            # Compacted: acquisitions, fences, effects and episodes stay; raw events go.
            self._remember(st, st.evidence)
            st.evidence = ()
            st.undisplaced = None
            forget_packed(st)
            st.ids = None
            st.cut |= int(Cut.EVIDENCE) | _IDS_CUT
            st.released_at = None
        else:
            self._watch(key, st)
            return
        self._watch(key, self.states.get(key))
        changed.add(key)
        if idle and st.remnant_only:
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
            cfg = self.config
            return states.sweep_keys(now - cfg.idle_ttl_s, now - cfg.remnant_ttl_s)
        return list(states)

    def _due_keys(self, now: float) -> list[str]:
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

    def _schedule(self, key: str, st: WorkflowState, now: float | None) -> None:
        """When `advance` must look at the workflow again: its first open episode to go quiet,
        or, once none is open, the end of its release's quiet period. Time changes nothing
        else: every other change comes with an event, and is settled then."""
        if now is None:
            return  # no clock (`audit`): `finish` settles what time would
        q = self.config.quiet_period_s
        due: float | None = None
        settled = True
        for ep in st.episodes.values():
            if ep.status is Status.OPEN:
                settled = False
                heard = ep.last_stale_at
                if heard is not None and heard + q > now and (due is None or heard + q < due):
                    due = heard + q
        if settled and st.released_at is not None:
            due = st.released_at + q
        if due is None:
            return
        was = self._due_at.get(key)
        if was is None or due < was:
            # An entry due later stays in the heap and is skipped when it comes out; an earlier
            # one is enough: the workflow is scheduled again when it is looked at.
            self._due_at[key] = due
            heappush(self._due, (due, key))

    def finish(self) -> list[FindingUpdate]:
        """The end of a recorded history (`audit`): silence measured per workflow on its own
        believed times, never on another workflow's clock nor on the absence of events."""
        updates: list[FindingUpdate] = []
        q = self.config.quiet_period_s
        for key, st in self.states.items():
            if not st.clock:
                if st.found:
                    updates.extend(self._settle_all(key, st, None, list(st.episodes.values())))
                continue
            believed = believe(st.clock, self.config.clock_skew_s)
            self.counters.times_disbelieved += believed.disbelieved
            if not st.found:
                continue
            now = believed.now
            alive = _heard(st)
            for ep in st.episodes.values():
                # Silence is measured from the displaced epoch's last sign of life.
                heard = None if ep.stale is None else union(ep.stale, alive.get(ep.displaced_epoch))
                then = None if heard is None else believed.at(heard.latest)
                quiet = now is not None and then is not None and now - then >= q
                if (st.cut & Cut.CLOCK or believed.cut) and _hinges_on_silence(st, ep):
                    ep.truncated = True  # the times it is measured on were partly forgotten
                update = self._settle(key, st, ep, quiet, None)
                if update is not None:
                    updates.append(update)
        return updates

    # ---- findings ---------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        """The latest revision of every finding still held (for reports and tests)."""
        return [
            render(key, st, ep, ep.revision)
            for key, st in self.states.items()
            for ep in st.episodes.values()
            if ep.revision
        ]

    def truncated_workflows(self) -> list[str]:
        """Workflows whose evidence a cap cut: their verdicts may be incomplete."""
        return sorted(key for key, st in self.states.items() if st.cut)

    def open_findings(self) -> dict[Severity, int]:
        """Published findings still open, by severity. Exact once `advance` has run: its first
        pass finds every open finding, and it watches them from then on."""
        counts = dict.fromkeys(Severity, 0)
        for ep in self._open_published():
            counts[ep.severity] += 1
        return counts

    def oldest_open_findings(self) -> dict[Severity, float]:
        """When the oldest published finding still open went open, by severity, on the clock
        the caller passed as `at`. A severity is left out when no finding of it is open, or
        none whose opening time is known (see `FindingStats`). As exact as `open_findings`."""
        oldest: dict[Severity, float] = {}
        for ep in self._open_published():
            at = ep.opened_at
            if at is not None:
                then = oldest.get(ep.severity)
                if then is None or at < then:
                    oldest[ep.severity] = at
        return oldest

    def _open_published(self) -> Iterator[Episode]:
        for key in self._watched:
            st = self.states.get(key)
            for ep in () if st is None else st.episodes.values():
                if ep.revision and ep.status is Status.OPEN:
                    yield ep

    def _watch(self, key: str, st: WorkflowState | None) -> None:
        """Keep `_watched` to the workflows with an open finding."""
        if st is not None and any(ep.status is Status.OPEN for ep in st.episodes.values()):
            self._watched.add(key)
        else:
            self._watched.discard(key)

    def _settle_all(
        self, key: str, st: WorkflowState, at: float | None, episodes: list[Episode]
    ) -> list[FindingUpdate]:
        updates: list[FindingUpdate] = []
        q = self.config.quiet_period_s
        reach = st.reach
        for ep in {id(ep): ep for ep in episodes}.values():  # once each, in order
            quiet = at is not None and ep.last_stale_at is not None and at - ep.last_stale_at >= q
            update = self._settle(key, st, ep, quiet, at)
            if update is not None:
                updates.append(update)
            if reach is not None:
                _place(st, reach, ep)
        if updates:  # an episode opens only with a revision
            self._watch(key, st)
        self._schedule(key, st, at)
        return updates

    def _settle(
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
        ep.status = Status.RESOLVED if _resolved(st, ep, quiet) else Status.OPEN
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
            self._observe(ep, finding, at)
        escalated = published is None or ep.severity.rank > published.rank
        return FindingUpdate(finding, escalated)

    def _observe(self, ep: Episode, finding: Finding, at: float | None) -> None:
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


def _changed(st: WorkflowState) -> None:
    """Something every finding of the workflow is rendered from changed (`Episode.changes`)."""
    for ep in st.episodes.values():
        ep.changes += 1


def _index_undisplaced(st: WorkflowState) -> None:
    """The retained events with `seq` that the acquisitions known so far do not displace, the
    acquisitions themselves among them (`raw_acquisition`)."""
    st.undisplaced = {}
    st.undisplaced_reach = Reach()
    for ev in st.evidence:
        _undisplaced(st, ev)
    for acq in st.acqs:
        _undisplaced(st, raw_acquisition(acq))


def _undisplaced(st: WorkflowState, ev: EventRecord) -> None:
    """Keep `ev` for a later acquisition to displace, unless one already does."""
    und = st.undisplaced
    assert und is not None
    if (
        ev.seq is None
        or (ev.kind not in STALE_CONDITION and not _signs_life(st, ev))
        or after_takeover(st, ev)
    ):
        return
    kept = und.get(ev.epoch)
    if kept is None:
        kept = und[ev.epoch] = [ev]
    elif ev.seq >= (kept[-1].seq or 0):  # every kept event has a seq
        kept.append(ev)  # in order, as most are
    else:
        insort(kept, ev, key=_SEQ)
        return  # its latest seq is the same
    reach = st.undisplaced_reach
    if reach is not None:
        reach.set(ev.epoch, ev.epoch, ev.seq)


def _heard(st: WorkflowState) -> dict[int, Latest]:
    """`audit`'s final word on each displaced epoch's signs of life besides evidence: those
    heard as they came, and every retained one now that the history's owners are all known (a
    verification may come before the acquisition that names its epoch's worker)."""
    heard = dict(st.uncertain or {})
    for ev in st.evidence:
        if _heard_from(st, ev):
            heard[ev.epoch] = extend(heard.get(ev.epoch), ev)
    return heard


def _heard_from(st: WorkflowState, ev: EventRecord) -> bool:
    """Is the event, not itself evidence, a sign of life of a displaced owner after the
    takeover (DESIGN §4 "Time and silence")?"""
    return (
        ev.kind not in STALE_CONDITION
        and ev.epoch < st.top
        and _signs_life(st, ev)
        and after_takeover(st, ev)
    )


def _signs_life(st: WorkflowState, ev: EventRecord) -> bool:
    """Is the event a sign of life of its epoch's owner, besides evidence? Its doubt about the
    lease, whoever sends it, or any other event that carries its epoch and its worker (a
    verification it sends included): either ends its silence (DESIGN §4 "Time and silence")."""
    if ev.kind == _UNCERTAIN:
        return True
    acq = acquisition(st, ev.epoch)
    if acq is not None:
        return acq.worker_id == ev.worker_id
    ep = st.episodes.get((ev.epoch, False))
    return ep is not None and ep.worker == ev.worker_id


def _place(st: WorkflowState, reach: Reach[EpisodeKey], ep: Episode) -> None:
    """Where a late acquisition must be to change the finding (DESIGN §4: its displaced owner,
    transition and current owner are chosen among the acquisitions): at or below its key, at or
    before its value. The key is its displaced epoch (a transition is of a higher epoch); when its
    current owner is below that (or none is known), -1, so that any epoch may rename it. The
    value is its latest condition's seq: a late acquisition after every condition renames
    nothing (each condition's transition is an acquisition before it)."""
    latest = ep.latest
    top = None if latest is None else latest.top
    value = NEVER if top is None or top.seq is None else top.seq
    key = ep.displaced_epoch
    last = None if latest is None else latest.latest
    current = None if last is None else current_owner_before(st, last)
    if current is None or current.epoch < key:
        key = -1
    reach.set(ep.key, key, value)


def _moved_by(ep: Episode, acq: AcquisitionRecord) -> bool:
    """Could an acquisition (kept already) rename this finding's displaced owner, its transition
    or its current owner? Not when none of the events that triggered its conditions comes after
    it: `current` and each condition's transition are chosen among the acquisitions before
    them. Asked of the whole set (`Latest`), not of its latest member alone: with `seq` on some
    events only, an acquisition after the latest by arrival can be before another by `seq`."""
    if ep.displaced_epoch == acq.epoch:
        return True
    return ep.latest is None or after(ep.latest, acq)


def _pin(
    st: WorkflowState,
    leaving: Iterable[EventRecord] | Iterable[AcquisitionRecord],
    print_of: Callable[[Any], int],
) -> None:
    """Records that stop being retained: their ids keep their fingerprints, taken now."""
    ids = st.ids
    if ids is not None:
        for record in leaving:
            if ids.get(record.event_id) == RETAINED:
                ids[record.event_id] = print_of(record)


def _retained_print(st: WorkflowState, event_id: str) -> int:
    """The fingerprint of a retained record's id (an id is `RETAINED` only while it is)."""
    for e in st.evidence:
        if e.event_id == event_id:
            return ev_print(e)
    for a in st.acqs:
        if a.event_id == event_id:
            return acq_print(a)
    raise AssertionError(f"id {event_id!r} is marked retained but no record holds it")


def _keep_last(eff: Effect, ev: EventRecord) -> None:
    """The latest effect of its kind per epoch (commits also per source: a retry is two commits
    from one source)."""
    kind = ev.kind
    slot = (ev.epoch, kind if kind != _COMMITTED else f"{kind}:{ev.source}")
    last = eff.lasts.get(slot)
    if last is None or before(last, ev):
        eff.lasts[slot] = ev


def _last_commit(eff: Effect, epoch: int) -> EventRecord:
    """The latest commit of the key under `epoch`, from any source (there is at least one):
    a look-up per source, however many epochs committed the key."""
    found: EventRecord | None = None
    for slot in _COMMIT_SLOTS:
        ev = eff.lasts.get((epoch, slot))
        if ev is not None:
            found = ev if found is None else later(found, ev)
    assert found is not None
    return found


def _failover(eff: Effect, lo: int, hi: int) -> ConditionRecord:
    """The failover duplicate of a key committed under `lo` and then `hi`, witnessed by the later
    of their first commits; confirmed when a destination confirmed the effect under both,
    whichever of their commits came first (the same answer in any arrival order)."""
    f_lo, f_hi = eff.firsts[lo], eff.firsts[hi]
    witness = later(f_lo, f_hi)
    both = eff.confirmed is not None and {lo, hi} <= eff.confirmed
    return new_record(
        ConditionRecord,
        (
            ConditionKind.DUPLICATE_EFFECT,
            witness.event_id,
            witness.seq,
            witness.pos,
            witness.effect_key,
            "failover",
            (lo, hi),
            _DESTINATION if both else Source.WORKER.value,
            witness.trace,
            (f_lo.worker_id, f_hi.worker_id),
            False,
        ),
    )


def _pair_commits(eff: Effect, lo: int, hi: int) -> tuple[EventRecord, ...]:
    """The commits of the key under two epochs that stand for all of them, derived from its
    `Effect` alone: the first and the latest of each."""
    return tuple(
        dict.fromkeys(
            (eff.firsts[lo], eff.firsts[hi], _last_commit(eff, lo), _last_commit(eff, hi))
        )
    )


def _commit_of(r: EventRecord | None, epoch: int, key: str) -> bool:
    return r is not None and r.epoch == epoch and r.effect_key == key and r.kind == _COMMITTED


def _resolved(st: WorkflowState, ep: Episode, quiet: bool) -> bool:
    """Known fenced (or quiet) and every affected effect key verified after its latest
    condition; never by retrying."""
    if ep.pending or ep.dup_pending or ep.keys_over:
        return False
    stale = ep.stale
    return ep.retry or stale is None or quiet or fenced(st, ep.displaced_epoch, stale)


def _hinges_on_silence(st: WorkflowState, ep: Episode) -> bool:
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
