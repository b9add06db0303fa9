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
from dataclasses import dataclass
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

    def take(
        self, key: str, workflow: WorkflowState, event: OwnershipEvent, at: float | None
    ) -> list[FindingUpdate]:
        """Account for one event of the workflow `key`; the finding revisions it causes."""
        observed = event.observed_at
        obs = None if observed is None else observed.timestamp()
        kind = _VALUE[event.kind]
        epoch = event.owner_epoch
        seq = event.seq
        worker = intern(event.worker_id)
        effect_key = event.effect_key
        if self.retention.seen(workflow, event.event_id, kind, epoch, seq, worker, effect_key):
            return []
        late = seq is not None and seq <= workflow.max_seq  # at one seq an acquisition is first
        # An unknown id may be a forgotten one, unless its seq is past every seq seen.
        uncertain = bool(workflow.cut & IDS_CUT) and (seq is None or seq <= workflow.max_seq)
        if seq is not None and seq > workflow.max_seq:
            workflow.max_seq = seq
        pos = workflow.pos = workflow.pos + 1
        source = _VALUE[event.source]
        if at is not None:
            workflow.last_at = at
        else:
            if obs is not None:
                workflow.last_at = obs if workflow.last_at is None else max(workflow.last_at, obs)
            tie = ("0" if kind == _ACQUIRED_VALUE else "1") + event.event_id  # acquisitions first
            self.retention.clock(workflow, seq, pos, obs, worker, source, tie)
        if kind == _ACQUIRED_VALUE:
            # What a finding's `context` shows of it (DESIGN §5) is kept with its record.
            acquisition = new_record(
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
            unnamed = self._acquire(workflow, acquisition, event, late)
            return self._acquired(key, workflow, acquisition, late, at, uncertain, unnamed)
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
        self.retention.retain(workflow, ev)
        if workflow.undisplaced is not None:
            keep_undisplaced(workflow, ev)
        if kind in _LEASE_KINDS:
            if kind == _HEARTBEAT:
                self.lease_health.heartbeat(workflow, epoch, obs, event)
            else:
                self._lease_event(key, workflow, kind, epoch, event, at)
        if kind not in _COMPACT_KINDS and not (workflow.acqs and epoch < workflow.acqs[-1].epoch):
            return []  # the usual case: the current owner's activity or attempt
        touched = self.ingest(workflow, ev, at, uncertain)
        return self.settler.settle_all(key, workflow, at, touched) if touched else []

    def _acquired(
        self,
        key: str,
        workflow: WorkflowState,
        acquisition: AcquisitionRecord,
        late: bool,
        at: float | None,
        uncertain: bool,
        unnamed: list[Episode],
    ) -> list[FindingUpdate]:
        """After an acquisition is kept: what it displaces when late, the sign of life it is
        after a takeover of its epoch, and the findings it may rename, settled with those that
        named an acquisition keeping it pushed out (`unnamed`)."""
        touched = (
            displace(workflow, acquisition, at, uncertain, self.config.max_effect_keys)
            if late
            else []
        )
        raw = raw_acquisition(acquisition)
        if workflow.undisplaced is not None:
            keep_undisplaced(workflow, raw)
        if heard_from(workflow, raw):
            touched.extend(restart_silence(workflow, raw, at))
        found = workflow.found
        if not found:
            return []
        # The findings whose owners or transition it may rename (`renamed`), and those that
        # named an acquisition it pushed out at the cap (`_keep`). Only these are rendered again.
        moved = renamed(
            workflow,
            acquisition,
            acquisition.seq if late and acquisition.seq is not None else ALWAYS,
        )
        for episode in moved:
            episode.changes += 1
        return self.settler.settle_all(key, workflow, at, [*touched, *moved, *unnamed])

    def ingest(
        self, workflow: WorkflowState, ev: EventRecord, at: float | None, uncertain: bool
    ) -> list[Episode]:
        """What one event adds to the compact state; the episodes it touched."""
        touched: list[Episode] = []
        kind = ev.kind
        acqs = workflow.acqs
        if (
            acqs
            and ev.epoch < acqs[-1].epoch
            and kind in STALE_CONDITION
            and displaced(workflow, ev.epoch, ev.seq, ev.pos)
        ):
            touched.append(add_stale(workflow, ev, at, uncertain, self.config.max_effect_keys))
        key = ev.effect_key
        if kind == _COMMITTED and key is not None:
            effect = self.retention.effect(workflow, key)
            keep_last(effect, ev)
            touched.extend(add_commit(workflow, effect, ev, uncertain, self.config.max_effect_keys))
        if kind in _FENCES or (kind == _REJECTED and ev.source == _DESTINATION):
            if workflow.fences is None:
                workflow.fences = {}
            points = workflow.fences.setdefault(ev.epoch, [])
            added = add_fence(points, ev.seq, ev.event_id, ev.pos)
            if added:
                episode = workflow.episodes.get((ev.epoch, False))
                if added > 1:  # fences were dropped: a status may hinge on one of them
                    episode = workflow.episode((ev.epoch, False))
                    episode.truncated = True
                if episode is not None:
                    touched.append(episode)
        elif kind == _VERIFIED and ev.source == _VERIFIER and key is not None:
            effect = self.retention.effect(workflow, key)
            if effect.verified is None:
                effect.verified = marks()
            if mark(effect.verified, ev.seq, ev.pos, ev.event_id):
                touched.extend(
                    episode
                    for episode in workflow.episodes.values()
                    if verify(episode, key, effect.verified)
                )
        if heard_from(workflow, ev):
            touched.extend(restart_silence(workflow, ev, at))
        return touched

    def _acquire(
        self,
        workflow: WorkflowState,
        acquisition: AcquisitionRecord,
        event: OwnershipEvent,
        late: bool,
    ) -> list[Episode]:
        """Keep the acquisition; then its lease health (`LeaseHealth.acquired`). Returns the
        findings that named an acquisition it pushed out at the cap."""
        top = workflow.top
        if late and workflow.undisplaced is None:
            index_undisplaced(workflow)  # from what the acquisitions known so far displace
        new_epoch, unnamed = self._keep(workflow, acquisition)
        if acquisition.epoch >= workflow.top:
            workflow.released_at = None  # the current epoch holds the lease again
        self.lease_health.acquired(workflow, acquisition, event, top, new_epoch)
        return unnamed

    def _keep(
        self, workflow: WorkflowState, acquisition: AcquisitionRecord
    ) -> tuple[bool, list[Episode]]:
        """Keep the acquisition in epoch order; is its epoch new, and which findings named the
        one forgotten at the cap? That changes no published finding by itself: the next
        revision of each says its evidence was cut. A new highest epoch is appended, and the
        staleness index extended, in constant time; a late one is inserted in place
        (`_rules.inserted`), a step or two when late acquisitions come newest first."""
        acqs = workflow.acqs
        top = acqs[-1].epoch if acqs else -1
        new_epoch = True
        unnamed: list[Episode] = []
        if acquisition.epoch > top:  # the usual case: a takeover by a new, higher epoch
            if isinstance(acqs, list):
                acqs.append(acquisition)
            else:
                acqs = workflow.acqs = acquisitions_of((*acqs, acquisition))
            appended(workflow)
        else:
            listed = acqs if isinstance(acqs, list) else list(acqs)
            i = bisect_left(listed, acquisition.epoch, key=ACQ_EPOCH)
            if i < len(listed) and listed[i].epoch == acquisition.epoch:
                new_epoch = False
                kept = listed[i]
                gone = kept if before(acquisition, kept) else acquisition
                if gone is kept:
                    listed[i] = acquisition
                if (
                    acquisition.seq is not None
                    and kept.seq is not None
                    and acquisition.pos != kept.pos
                ):
                    # The epoch is acquired before whatever either acquisition is before: by seq
                    # the earlier one, by arrival the one that came first.
                    listed[i] = listed[i]._replace(pos=min(acquisition.pos, kept.pos))
                if listed[i] != kept:  # a finding may name it (its transition, its owners)
                    acqs = workflow.acqs = acquisitions_of(listed)
                    replaced(workflow, i, kept)
                    self.retention.changed(workflow)
                # Folded into the other acquisition of its epoch, the one that goes stays a raw
                # event: its id is known when it comes again, however small the workflow is,
                # and after a takeover it is a sign of its owner's life.
                self.retention.retain(workflow, raw_acquisition(gone))
            else:
                listed.insert(i, acquisition)
                if listed is not acqs:
                    acqs = workflow.acqs = acquisitions_of(listed)
                inserted(workflow, i)
        if len(acqs) > self.config.max_acquisitions:
            gone = acqs[0]
            self.retention.index_ids(workflow)
            pin(workflow, acqs[:1], acq_print)
            if isinstance(acqs, list) and len(acqs) > LIST_FROM:
                del acqs[0]  # a list stays a list: the shape `acquisitions_of` gives
            else:
                workflow.acqs = acquisitions_of(acqs[1:])
            dropped_first(workflow, 1)
            self.counters.acquisitions_dropped += 1
            self.retention.cut(workflow, Cut.ACQUISITIONS)
            # The findings that may have named what went (its owner, a transition, a current
            # owner) are those it could rename: each is published again if its document changed.
            threshold = ALWAYS if gone.seq is None else gone.seq
            for episode in renamed(workflow, gone, threshold):
                episode.changes += 1
                unnamed.append(episode)
        return new_epoch, unnamed

    def _lease_event(
        self,
        key: str,
        workflow: WorkflowState,
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
            if epoch >= workflow.top:
                workflow.released_at = workflow.last_at
                health.released(workflow)
                self.deadlines.schedule(key, workflow, at)
        elif kind == _LOST:
            health.lost(workflow, event.attrs)
        else:
            health.uncertain(workflow, event.attrs)
