"""Taking an event in: from one ownership event to the episodes it touches, settled.

`Intake.take` runs for every event, so its common case is written for speed. The tricks, where
each lives, and the benchmark line that shows it (`bench/bench_engine.py` "detection alone" and
"memory" unless named otherwise):
- records are tuples built with `tuple.__new__` (`_records.new_record`), not the NamedTuple
  constructor;
- a workflow's raw events are a tuple while short and a list from 8 on (`_state.LIST_FROM`);
- worker ids are interned (here) and lease durations shared (`_lease`), one object each;
- seen ids are scanned at C speed (`map` + `in`) until a workflow outgrows a scan
  (`Retention.seen`);
- cut flags are plain ints on the hot path, not `IntFlag` operations (`_retention.IDS_CUT`);
- the current owner's activity and attempts return before the compact state is touched (here);
- a finding's lists are bounded, so a revision costs the same at any size
  (`bench/bench_growth.py`);
- the `splitbrain` command raises the garbage collector's first threshold
  (`detector/gc_tuning.py`; the bench prints both settings).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from enum import StrEnum
from sys import intern
from typing import Final

from detector.contracts.events import Kind, OwnershipEvent, Source

from ._conditions import add_commit, add_stale, keep_last
from ._config import Config
from ._context import context_of
from ._counts import Counters
from ._deadlines import Deadlines
from ._episode import verify
from ._lease import LeaseHealth
from ._reach import ALWAYS
from ._records import (
    ACQ_EPOCH,
    AcquisitionRecord,
    EventRecord,
    acq_print,
    before,
    mark,
    marks,
    new_record,
    raw_acquisition,
)
from ._retention import IDS_CUT, Retention, pin
from ._rules import (
    STALE_CONDITION,
    add_fence,
    appended,
    displaced,
    dropped_first,
    inserted,
    replaced,
)
from ._settling import FindingUpdate, Settler
from ._silence import heard_from, restart_silence
from ._state import LIST_FROM, Cut, Episode, WorkflowState, acquisitions_of
from ._takeover import displace, index_undisplaced, keep_undisplaced, renamed

_VALUE: Final[dict[StrEnum, str]] = {m: m.value for m in (*Kind, *Source)}
_ACQUIRED_VALUE: Final = Kind.LEASE_ACQUIRED.value
_HEARTBEAT: Final = Kind.HEARTBEAT.value
_RELEASED: Final = Kind.LEASE_RELEASED.value
_COMMITTED: Final = Kind.EFFECT_COMMITTED.value
_VERIFIED: Final = Kind.OUTCOME_VERIFIED.value
_LOST: Final = Kind.LEASE_LOST.value
_UNCERTAIN: Final = Kind.OWNERSHIP_UNCERTAIN.value
_FENCES: Final = frozenset({_LOST, _RELEASED})
# Kinds lease health looks at (acquisitions apart).
_LEASE_KINDS: Final = frozenset({_HEARTBEAT, _RELEASED, _LOST, _UNCERTAIN})
_REJECTED: Final = Kind.EFFECT_REJECTED.value
_DESTINATION: Final = Source.DESTINATION.value
_VERIFIER: Final = Source.VERIFIER.value
# Kinds whose record keeps its event's context: acquisitions, and what can be a condition.
_CONTEXT_KINDS: Final = frozenset({_ACQUIRED_VALUE, *STALE_CONDITION})
# Kinds that change the compact state whoever sends them (the rest only when displaced).
_COMPACT_KINDS: Final = frozenset({_COMMITTED, _REJECTED, _VERIFIED, *_FENCES})


@dataclass(slots=True)
class Intake:
    """Takes each event into its workflow's state and settles the episodes it touched."""

    config: Config
    counters: Counters
    lease_health: LeaseHealth
    retention: Retention
    settler: Settler
    deadlines: Deadlines
    # The findings that named an acquisition `_keep` pushed out at the cap, for `_acquired`.
    _unnamed: list[Episode] = field(default_factory=list)

    def take(
        self, key: str, st: WorkflowState, event: OwnershipEvent, at: float | None
    ) -> list[FindingUpdate]:
        """Account for one event of the workflow `key`; the finding revisions it causes."""
        observed = event.observed_at
        obs = None if observed is None else observed.timestamp()
        kind = _VALUE[event.kind]
        epoch = event.owner_epoch
        seq = event.seq
        worker = intern(event.worker_id)
        effect_key = event.effect_key
        if self.retention.seen(st, event.event_id, kind, epoch, seq, worker, effect_key):
            return []
        late = seq is not None and seq <= st.max_seq  # at one seq an acquisition is first
        # An unknown id may be a forgotten one, unless its seq is past every seq seen.
        uncertain = bool(st.cut & IDS_CUT) and (seq is None or seq <= st.max_seq)
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
            self.retention.clock(st, seq, pos, obs, worker, source, tie)
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
        self.retention.retain(st, ev)
        if st.undisplaced is not None:
            keep_undisplaced(st, ev)
        if kind in _LEASE_KINDS:
            if kind == _HEARTBEAT:
                self.lease_health.heartbeat(st, epoch, obs, event)
            else:
                self._lease_event(key, st, kind, epoch, event, at)
        if kind not in _COMPACT_KINDS and not (st.acqs and epoch < st.acqs[-1].epoch):
            return []  # the usual case: the current owner's activity or attempt
        touched = self.ingest(st, ev, at, uncertain)
        return self.settler.settle_all(key, st, at, touched) if touched else []

    def _acquired(
        self,
        key: str,
        st: WorkflowState,
        acq: AcquisitionRecord,
        late: bool,
        at: float | None,
        uncertain: bool,
    ) -> list[FindingUpdate]:
        touched = displace(st, acq, at, uncertain, self.config.max_effect_keys) if late else []
        raw = raw_acquisition(acq)
        if st.undisplaced is not None:
            keep_undisplaced(st, raw)
        if heard_from(st, raw):
            touched.extend(restart_silence(st, raw, at))
        found = st.found
        if not found:
            return []
        # The findings whose owners or transition it may rename (`renamed`), and those that
        # named an acquisition it pushed out at the cap (`_keep`). Only these are rendered again.
        moved = renamed(st, acq, acq.seq if late and acq.seq is not None else ALWAYS)
        for ep in moved:
            ep.changes += 1
        unnamed, self._unnamed = self._unnamed, []
        return self.settler.settle_all(key, st, at, [*touched, *moved, *unnamed])

    def ingest(
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
            touched.append(add_stale(st, ev, at, uncertain, self.config.max_effect_keys))
        key = ev.effect_key
        if kind == _COMMITTED and key is not None:
            eff = self.retention.effect(st, key)
            keep_last(eff, ev)
            touched.extend(add_commit(st, eff, ev, uncertain, self.config.max_effect_keys))
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
            eff = self.retention.effect(st, key)
            if eff.verified is None:
                eff.verified = marks()
            if mark(eff.verified, ev.seq, ev.pos, ev.event_id):
                touched.extend(ep for ep in st.episodes.values() if verify(ep, key, eff.verified))
        if heard_from(st, ev):
            touched.extend(restart_silence(st, ev, at))
        return touched

    def _acquire(
        self, st: WorkflowState, acq: AcquisitionRecord, event: OwnershipEvent, late: bool
    ) -> None:
        """Keep the acquisition; then its lease health (`LeaseHealth.acquired`)."""
        top = st.top
        if late and st.undisplaced is None:
            index_undisplaced(st)  # from what the acquisitions known so far displace
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
                    self.retention.changed(st)
                # Folded into the other acquisition of its epoch, the one that goes stays a raw
                # event: its id is known when it comes again, however small the workflow is,
                # and after a takeover it is a sign of its owner's life.
                self.retention.retain(st, raw_acquisition(gone))
            else:
                listed.insert(i, acq)
                if listed is not acqs:
                    acqs = st.acqs = acquisitions_of(listed)
                inserted(st, i)
        if len(acqs) > self.config.max_acquisitions:
            gone = acqs[0]
            self.retention.index_ids(st)
            pin(st, acqs[:1], acq_print)
            if isinstance(acqs, list) and len(acqs) > LIST_FROM:
                del acqs[0]  # a list stays a list: the shape `acquisitions_of` gives
            else:
                st.acqs = acquisitions_of(acqs[1:])
            dropped_first(st, 1)
            self.counters.acquisitions_dropped += 1
            self.retention.cut(st, Cut.ACQUISITIONS)
            # The findings that may have named what went (its owner, a transition, a current
            # owner) are those it could rename: each is published again if its document changed.
            threshold = ALWAYS if gone.seq is None else gone.seq
            for ep in renamed(st, gone, threshold):
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
                self.deadlines.schedule(key, st, at)
        elif kind == _LOST:
            health.lost(st, event.attrs)
        else:
            health.uncertain(st, event.attrs)
