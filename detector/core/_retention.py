"""Retention (DESIGN §4): the caps that bound a workflow's memory, and what each one cut. A cut
is never silent: it marks the workflow (`WorkflowState.cut`), and every finding of the workflow is
settled again after the event that made it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

from detector.contracts.events import Kind

from ._conditions import keep_last
from ._config import Config
from ._counts import Counters
from ._records import (
    ACQ_ID,
    EVENT_ID,
    RETAINED,
    AcquisitionRecord,
    EventRecord,
    acq_print,
    ev_print,
    fingerprint,
    mark,
    marks,
)
from ._rules import EFFECT_OCCURRENCES
from ._state import LIST_FROM, Cut, Effect, Evidence, WorkflowState, evidence_of, forget_packed

_ACTIVITY_KINDS: Final = frozenset({Kind.HEARTBEAT.value, Kind.PROGRESS.value})
_IDS_FROM: Final = LIST_FROM  # records a workflow holds before its ids get an index
# Cuts that can hide a finding that does not exist yet: counted as truncated workflows.
_HIDING: Final = int(Cut.ACQUISITIONS | Cut.EFFECT_KEYS)
# Plain ints on the hot path: an IntFlag operation goes through the enum machinery (1 µs).
IDS_CUT: Final = int(Cut.EVENT_IDS)


@dataclass(slots=True)
class Retention:
    """Keeps a workflow's records within the caps of `config`, counting what they forget."""

    config: Config
    counters: Counters
    # Set by a change of what every finding of a workflow is rendered from (a cut): the event's
    # caller (`Detector.observe`, or `advance` for the workflow it let time pass for) then
    # settles them all, so that no document changes without its revision. A cut happens once
    # per kind and workflow.
    resettle: bool = False

    def changed(self, workflow: WorkflowState) -> None:
        """Something every finding of the workflow is rendered from changed (`Episode.changes`):
        each is settled again after this event."""
        for episode in workflow.episodes.values():
            episode.changes += 1
        self.resettle = True

    def seen(
        self,
        workflow: WorkflowState,
        event_id: str,
        kind: str,
        epoch: int,
        seq: int | None,
        worker: str,
        key: str | None,
    ) -> bool:
        """Has this id been seen? A repeated id changes nothing, whatever it carries."""
        ids = workflow.ids
        if ids is None:
            old: int | None = None
            # Scans at C speed: the usual answer is "not seen", over a handful of records.
            if event_id in map(EVENT_ID, workflow.evidence) or event_id in map(
                ACQ_ID, workflow.acqs
            ):
                old = RETAINED
            else:
                if len(workflow.evidence) + len(workflow.acqs) + 1 >= _IDS_FROM:
                    ids = self.index_ids(workflow)
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
                        workflow.ids_packed = None
                        workflow.cut |= IDS_CUT
                        self.counters.ids_dropped += len(gone)
                return False
        if old == RETAINED:
            old = _retained_print(workflow, event_id)
        if old == fingerprint(kind, epoch, seq, worker, key):
            self.counters.redelivered += 1
        else:
            self.counters.id_conflicts += 1
        return True

    def index_ids(self, workflow: WorkflowState) -> dict[str, int]:
        """From a scan of the few records to a dict, before any of them can be forgotten."""
        if workflow.ids is None:
            ids = dict.fromkeys(map(ACQ_ID, workflow.acqs), RETAINED)
            ids.update(dict.fromkeys(map(EVENT_ID, workflow.evidence), RETAINED))
            workflow.ids = ids
            workflow.ids_packed = None
        return workflow.ids

    def retain(self, workflow: WorkflowState, ev: EventRecord) -> None:
        """Keep a raw event for a late acquisition to look back at; past the cap, forget."""
        kept = workflow.evidence
        if isinstance(kept, list):
            kept.append(ev)
        elif len(kept) + 1 < LIST_FROM:
            kept = workflow.evidence = (*kept, ev)
        else:
            kept = workflow.evidence = [*kept, ev]
        if len(kept) > self.config.max_evidence:
            workflow.evidence = self._forget(workflow, kept)

    def _forget(self, workflow: WorkflowState, kept: Evidence) -> Evidence:
        """Over the cap, forget the oldest raw events, activity first: effects, fences and
        verifications live on in compact form. A quarter at once: one pass per cap/4 events."""
        self.index_ids(workflow)
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
        self.cut(workflow, Cut.EVIDENCE)
        gone = [e for e in kept if e.kind in _ACTIVITY_KINDS][:activity] + keep[: excess - activity]
        pin(workflow, gone, ev_print)
        self.remember(workflow, gone)
        forget_packed(workflow, gone)
        workflow.undisplaced = None
        return evidence_of(keep[excess - activity :])

    def remember(self, workflow: WorkflowState, gone: Iterable[EventRecord]) -> None:
        """What forgetting raw events leaves: where they were (a late acquisition before any of
        them is blind), and the latest attempt, commit and rejection per key and epoch."""
        if workflow.forgotten is None:
            workflow.forgotten = marks()
        for e in gone:
            mark(workflow.forgotten, e.seq, e.pos, e.event_id)
            if e.effect_key is not None and e.kind in EFFECT_OCCURRENCES:
                keep_last(self.effect(workflow, e.effect_key), e)

    def effect(self, workflow: WorkflowState, key: str) -> Effect:
        """The key's effect, to change: its packed row is dropped (`Effect.packed`)."""
        effects = workflow.effects
        if effects is None:
            effects = workflow.effects = {}
        effect = effects.get(key)
        if effect is not None:
            effect.packed = None
        else:
            effect = effects[key] = Effect()
            if len(effects) > self.config.max_effect_keys:
                excess = max(len(effects) // 4, 1)
                for gone in list(islice(effects, excess)):
                    del effects[gone]
                self.counters.effects_dropped += excess
                self.cut(workflow, Cut.EFFECT_KEYS)
        return effect

    def clock(
        self,
        workflow: WorkflowState,
        seq: int | None,
        pos: int,
        obs: float | None,
        worker: str,
        source: str,
        at_seq: str,
    ) -> None:
        """Audit: every event's place and time, for silence measured at `finish`."""
        clock = workflow.clock
        if clock is None:
            clock = workflow.clock = []
        clock.append((seq, pos, obs, worker, source, at_seq))
        if len(clock) > self.config.max_evidence:
            gone = len(clock) // 4
            if any(entry[2] is not None for entry in clock[:gone]):
                self.cut(workflow, Cut.CLOCK)  # an entry without a time says nothing of silence
            del clock[:gone]

    def cut(self, workflow: WorkflowState, what: Cut) -> None:
        if what & _HIDING and not workflow.cut & _HIDING:
            self.counters.workflows_truncated += 1
        if int(what) & ~workflow.cut:
            self.changed(workflow)
        workflow.cut |= int(what)


def pin(
    workflow: WorkflowState,
    leaving: Iterable[EventRecord] | Iterable[AcquisitionRecord],
    print_of: Callable[[Any], int],
) -> None:
    """Records that stop being retained: their ids keep their fingerprints, taken now."""
    ids = workflow.ids
    if ids is not None:
        for record in leaving:
            if ids.get(record.event_id) == RETAINED:
                ids[record.event_id] = print_of(record)
                workflow.ids_packed = None


def _retained_print(workflow: WorkflowState, event_id: str) -> int:
    """The fingerprint of a retained record's id (an id is `RETAINED` only while it is)."""
    for e in workflow.evidence:
        if e.event_id == event_id:
            return ev_print(e)
    for a in workflow.acqs:
        if a.event_id == event_id:
            return acq_print(a)
    raise AssertionError(f"id {event_id!r} is marked retained but no record holds it")
