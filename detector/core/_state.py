"""Per-workflow state: what the rules need later, and its byte encoding for a changelog.

Raw events are kept only for a late acquisition to look back at; everything a verdict needs
later is also kept in compact form that routine activity cannot push out: per effect key its
first commit under each epoch (`Effect`), per epoch the latest proof that it was fenced, and per
finding what still waits for verification (`Episode.pending`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from enum import IntFlag
from sys import intern
from types import MappingProxyType
from typing import Any, Final, TypeVar

import msgspec

from detector.contracts.findings import ConditionKind, Severity, Status

from ._context import Context, context_row
from ._labels import UNLABELLED, Labels
from ._reach import Reach
from ._records import (
    ACQ_ID,
    EVENT_ID,
    LAST_ID,
    NONE,
    RETAINED,
    AcquisitionRecord,
    ConditionRecord,
    EventRecord,
    Latest,
    Marks,
    event_of,
    latest_of,
    marks_of,
)

# 8 (the latest): an effect's copy of a retained raw event is written as the event's position
# (`pos`), not its index in the evidence: an index shifts whenever the oldest events are forgotten,
# and with it every effect's row (re-encoded at each transaction of a workflow at the caps: most of
# what the changelog cost, `bench/bench_changelog_level.py --shape long`); a position does not.
# Version 7 states, with indexes, are read as they are.
# 7: records keep their event's context (DESIGN §5 `context`): an acquisition's
# and an event's row end in it (None, or an array of [key, value] pairs), and an episode's row in
# the context of its displaced owner's acquisition as its finding last showed it
# (`Episode.displaced_ctx`), then the occurrences of its failover duplicates awaiting a verifier,
# apart from its own (`Episode.dup_pending`): a duplicate belongs to the episode of the epoch just
# below the next one that committed its key, and gives way when a commit of an epoch between them
# arrives late (DESIGN §4). States versions 3 to 6 wrote are read as they are, without context,
# their duplicates' occurrences in `pending`.
# 6: a workflow whose findings all resolved is forgotten after `idle_ttl_s` down to `past`, what
# its findings' later revisions need (`WorkflowState.past`): one field more, `None` in the states
# version 5 wrote, which are read as they are. 5: two events at one seq are ordered by id (DESIGN
# §4): marks and pending occurrences carry the id, fences are points, an episode keeps its stale
# events and conditions as `Latest`, and the workflow the times its displaced owners said they were
# uncertain; version 4 states are read as they are, each of these from what they kept. 4: an
# effect's record that is also a retained raw event is written as its index in the evidence, not a
# copy (a commit is in `firsts`, `twice` and `lasts` too: a quarter of a state's bytes,
# `bench/bench_worker.py`). 3: compact effects, fences and pending verifications; it has the same
# layout, without references, and is read as it is. 1 (JSON) and 2 (the retained records only) are
# read by replaying their records (`detector.core._upgrade`).
STATE_VERSION: Final = 8
INDEX_REFS_UNTIL: Final = 7  # the last version whose effect rows refer by index


class Cut(IntFlag):
    """What a retention cap cut from a workflow: each can hide or change a verdict."""

    EVIDENCE = 1  # raw events: a late acquisition cannot look back at them
    ACQUISITIONS = 2  # a forgotten takeover cannot make later events stale
    EFFECT_KEYS = 4  # a duplicate of a forgotten commit cannot be found
    EVENT_IDS = 8  # a redelivery of a forgotten id cannot be recognised
    CLOCK = 16  # the times silence is measured on
    ENGINE_ERROR = 32  # an event the engine raised on: what it did of it may be incomplete


Point = tuple[int | None, int, str]  # (seq, pos, event_id): an occurrence awaiting verification
FencePoint = tuple[int | None, str, int]  # (seq, event_id, pos) of a fence (`_rules.add_fence`)


@dataclass(slots=True)
class Effect:
    """One effect key of a workflow, compact: what duplicates and verification need."""

    firsts: dict[int, EventRecord] = field(default_factory=dict)  # epoch -> its earliest commit
    # (epoch, source) -> the two earliest commits with distinct ids: a retry needs the second
    twice: dict[tuple[int, str], list[EventRecord]] = field(default_factory=dict)
    # (epoch, kind) -> the latest commit (per source), and the latest attempt or rejection
    # once its raw event is forgotten: what a late acquisition can still find stale
    lasts: dict[tuple[int, str], EventRecord] = field(default_factory=dict)
    confirmed: set[int] | None = None  # epochs a destination confirmed
    verified: Marks | None = None  # verifications of the key
    # Not persisted: this key's row as `encode_state` last wrote it. A workflow's state is written
    # at every transaction that touched it, its effects far more rarely change: the engine drops
    # the row whenever it takes the effect to change it (`Retention.effect`), and when a raw
    # event the row refers to (by its position) is forgotten (`forget_packed`).
    packed: msgspec.Raw | None = field(default=None, compare=False, repr=False)
    # Not persisted: the epochs of `firsts`, sorted, for the epochs next to a commit's
    # (`_conditions.add_commit`); built from `firsts` at its first use.
    order: list[int] | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Episode:
    """A published finding's memory. Everything a revision needs is kept incrementally, so an
    event costs the same however many conditions the finding already holds."""

    displaced_epoch: int
    retry: bool
    revision: int = 0
    status: Status = Status.OPEN
    severity: Severity = Severity.INFO
    listed: dict[tuple[str, str | None, str | None], ConditionRecord] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)  # effect key -> its conditions' bits
    keys_over: int = 0  # condition occurrences on keys beyond the cap
    total: int = 0  # distinct conditions
    activity: bool = False
    pending: dict[str, list[Point]] = field(default_factory=dict)  # unverified occurrences
    # Those of its failover duplicates, per key: the partner epoch of a key's duplicate can
    # change (`_episode.replace_duplicate`), and what it added is then rebuilt from the key's
    # `Effect`, apart from the episode's own occurrences.
    dup_pending: dict[str, list[Point]] = field(default_factory=dict)
    unconfirmed: int = 0  # committed/rejected/duplicate conditions no destination confirmed
    confirmations: int = 0
    unanswered: int = 0  # keys attempted and never rejected
    first_stale: EventRecord | None = None
    stale: Latest | None = None  # the displaced epoch's stale events
    latest: Latest | None = None  # the events that triggered any condition
    last_stale_at: float | None = None  # the caller's clock (a worker's processing time)
    # The caller's clock when the finding last went open (its first revision, or a reopening):
    # metrics only (the age of open findings, their time to resolution), never a verdict.
    opened_at: float | None = None
    shown: list[str] = field(default_factory=list)  # the first effect keys, sorted
    digest: int = 0
    worker: str | None = None
    truncated: bool = False
    # The context of the displaced owner's acquisition as the finding last showed it: what it
    # goes on showing once that acquisition is forgotten at the cap, as `worker` names the owner
    # (a document never changes without a new revision).
    displaced_ctx: Context | None = None
    # Not persisted: counts the changes of what the finding is rendered from (its conditions,
    # and its workflow's acquisitions and cuts); with its status, severity and `truncated`, it
    # is what the document was last made from (`rendered`). An event that changes none of them
    # costs no rendering and no digest.
    changes: int = field(default=0, compare=False, repr=False)
    rendered: tuple[int, Status, Severity, bool] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def key(self) -> tuple[int, bool]:
        return (self.displaced_epoch, self.retry)

    @property
    def last_stale(self) -> EventRecord | None:
        """The stale event no other stale event follows (DESIGN §4)."""
        return None if self.stale is None else self.stale.latest


# Retained raw events: a tuple while short, which has no spare capacity (most workflows hold two
# or three records); a list from `LIST_FROM` records on, so that an append touches one record
# instead of copying the tuple and re-counting the references of every record in it.
Evidence = tuple[EventRecord, ...] | list[EventRecord]
LIST_FROM: Final = 8


def evidence_of(records: Iterable[EventRecord]) -> Evidence:
    kept = tuple(records)
    return kept if len(kept) < LIST_FROM else list(kept)


# Acquisitions, sorted by epoch: the same shapes as `Evidence`, for the same reasons (a lease
# that flaps thousands of times appends to a list instead of copying a tuple each time).
Acquisitions = tuple[AcquisitionRecord, ...] | list[AcquisitionRecord]


def acquisitions_of(records: Iterable[AcquisitionRecord]) -> Acquisitions:
    kept = tuple(records)
    return kept if len(kept) < LIST_FROM else list(kept)


EpisodeKey = tuple[int, bool]
_NO_EPISODES: Final[Mapping[EpisodeKey, Episode]] = MappingProxyType({})
# seq, pos, time, worker, source, and the place at its seq (`_records.tie`, as one string)
ClockEntry = tuple[int | None, int, float | None, str, str, str]
# What a forgotten finding's later revisions need (`WorkflowState.past`): its episode's key
# (displaced epoch, retry), its latest revision, its severity and its digest.
Past = tuple[int, bool, int, str, int]
# `WorkflowState.lease_until` once the current epoch released its lease.
LEASE_RELEASED: Final = -math.inf


@dataclass(slots=True)
class WorkflowState:
    """Everything kept for one workflow key. Bounded by the engine's caps."""

    pos: int = 0
    max_seq: int = -1
    acqs: Acquisitions = ()  # sorted by epoch
    evidence: Evidence = ()
    # Seen event ids and a fingerprint of their content; built once the workflow outgrows a
    # scan of its few records (most never do).
    ids: dict[str, int] | None = None
    effects: dict[str, Effect] | None = None
    fences: dict[int, list[FencePoint]] | None = None  # epoch -> when it was known fenced
    # None until the first finding: most workflows never have one, and an empty dict costs 64 B.
    found: dict[EpisodeKey, Episode] | None = None
    clock: list[ClockEntry] | None = None  # audit only: the emitters' times, for silence
    cut: int = 0  # `Cut` flags
    forgotten: Marks | None = None  # the latest raw events forgotten at the cap
    # A late acquisition of this epoch came after some of them: what epochs below it did after
    # the takeover may be among what was forgotten.
    blind_below: int = -1
    last_at: float | None = None
    released_at: float | None = None
    hb_obs: float | None = None
    # The tool class alone, as versions 1 and 2 kept it (`detector.core._upgrade`): `labels`.
    tool_class: InitVar[str | None] = None
    lease_s: float | None = None
    # The bounded labels (tool_class, model, provider) of the current epoch's acquisition: one
    # tuple shared by every workflow with the same labels (`LeaseHealth.stats_of`). A restored
    # state's are bounded again by the engine at their first use.
    labels: Labels | None = None
    # Lease health only, never a verdict: the `lease_until` (the coordination store's clock) of
    # the current epoch's latest acquisition or heartbeat, or `LEASE_RELEASED`.
    lease_until: float | None = None
    # Displaced epoch -> its signs of life after the takeover besides evidence (its
    # `ownership_uncertain` events, and any other event carrying its epoch and its worker): they
    # end its silence (DESIGN §4), like its stale events.
    uncertain: dict[int, Latest] | None = None
    # The findings of the workflow that were forgotten once resolved and idle: a later episode of
    # one goes on at its next revision, under its finding id, never publishing one twice.
    past: tuple[Past, ...] | None = None
    # Not persisted: the forgotten ids (`ids` without the retained records' own) as
    # `encode_state` last wrote them. Most of the index, and most often unchanged: they change
    # only when a record stops being retained (`pin`) and when the oldest go at the cap; whatever
    # changes them drops this.
    ids_packed: msgspec.Raw | None = field(default=None, compare=False, repr=False)
    # Not persisted: suffix minima over `acqs` for the staleness test, rebuilt on demand.
    index: tuple[list[int], list[int], list[int], list[int]] | None = field(
        default=None, compare=False, repr=False
    )
    # Not persisted: the retained events with `seq` that no acquisition displaces yet, by epoch
    # and sorted by seq, for acquisitions that arrive after the events they displace. Built at
    # the first such acquisition, dropped when raw events are forgotten.
    undisplaced: dict[int, list[EventRecord]] | None = field(
        default=None, compare=False, repr=False
    )
    # Not persisted, both `_reach.Reach`es, for the late acquisitions: `undisplaced`'s epochs by
    # their latest seq (built with it), and the findings each could change (`_takeover.reach_of`).
    undisplaced_reach: Reach[int] | None = field(default=None, compare=False, repr=False)
    reach: Reach[tuple[int, bool]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self, tool_class: str | None) -> None:
        if tool_class is not None:
            self.labels = (tool_class, UNLABELLED, UNLABELLED)

    @property
    def episodes(self) -> Mapping[EpisodeKey, Episode]:
        return self.found if self.found is not None else _NO_EPISODES

    def episode(self, key: EpisodeKey) -> Episode:
        """The episode for `key`, opened if there is none yet."""
        if self.found is None:
            self.found = {}
        ep = self.found.get(key)
        if ep is None:
            ep = self.found[key] = Episode(key[0], key[1])
            if self.past is not None:
                self._resume(ep)
        return ep

    def _resume(self, ep: Episode) -> None:
        """A forgotten finding of this key goes on: its revisions, severity and digest."""
        key = ep.key
        for past in self.past or ():
            if (past[0], past[1]) == key:
                _, _, ep.revision, severity, ep.digest = past
                ep.severity = Severity(severity)
                ep.status = Status.RESOLVED  # as it was published last
                rest = tuple(p for p in self.past or () if p is not past)
                self.past = rest or None
                return

    def remnant(self, now: float) -> WorkflowState:
        """What is kept of a workflow whose findings all resolved once it is forgotten at `now`:
        where its positions and seqs stood, what was cut, and what each finding's later
        revisions need. Its raw events, acquisitions and effects go: a later finding says its
        evidence was cut. `last_at` becomes `now`, after every revision it published: a remnant
        expires `Config.remnant_ttl_s` after it, once no reader can still hold them."""
        past = [*(self.past or ())]
        past.extend(
            (ep.displaced_epoch, ep.retry, ep.revision, ep.severity.value, ep.digest)
            for ep in self.episodes.values()
            if ep.revision
        )
        forgotten = Cut.EVIDENCE | Cut.ACQUISITIONS | Cut.EFFECT_KEYS | Cut.EVENT_IDS
        return WorkflowState(
            pos=self.pos,
            max_seq=self.max_seq,
            cut=self.cut | int(forgotten),
            last_at=now,
            past=tuple(past) or None,
        )

    @property
    def remnant_only(self) -> bool:
        """Nothing but forgotten findings (`past`) and no episode: a remnant, or one that
        events without a finding have touched since. It goes at `Config.remnant_ttl_s`."""
        return self.past is not None and not self.found

    @property
    def watched(self) -> bool:
        """An open finding or a release: `Detector.advance` looks at it at every tick."""
        return self.released_at is not None or any(
            ep.status is Status.OPEN for ep in self.episodes.values()
        )

    @property
    def top(self) -> int:
        """The highest epoch acquired so far, or -1 before any acquisition."""
        return self.acqs[-1].epoch if self.acqs else -1


# ---- encoding ------------------------------------------------------------------------------

# msgspec writes the same msgpack bytes as `msgpack.packb`, at half its cost on these states (the
# changelog write is the worker's largest cost: docs/benchmarks.md, "The worker's cost per
# event"), and reads them back (`detector.core._upgrade`). Reused, as msgspec recommends: an
# encoder keeps no state between calls.
_ENCODER: Final = msgspec.msgpack.Encoder()


def _ev(row: list[Any] | None) -> EventRecord | None:
    return None if row is None else event_of(row)


def _acquisition(row: list[Any]) -> AcquisitionRecord:
    epoch, seq, pos, eid, worker, obs, *ctx = row  # before version 7 without its context
    return AcquisitionRecord(
        epoch, seq, pos, eid, intern(worker), obs, context_row(ctx[0]) if ctx else None
    )


def _cond_row(c: ConditionRecord) -> list[Any]:
    epochs = None if c.epochs is None else list(c.epochs)
    workers = None if c.workers is None else list(c.workers)
    return [
        c.kind.value,
        c.event_id,
        c.seq,
        c.pos,
        c.effect_key,
        c.cause,
        epochs,
        c.source,
        c.trace,
        workers,
        c.by_seq,
    ]


def cond_of(row: list[Any]) -> ConditionRecord:
    """A condition from its row (version 7; versions 3 to 6 lack the last field, versions 1 and
    2 the last two). A retry's duplicate written before version 7 counts as placed by seq when
    its witness carries one, as those versions read it."""
    epochs = None if row[6] is None else tuple(row[6])
    workers = None if len(row) < 10 or row[9] is None else tuple(row[9])
    by_seq = row[10] if len(row) > 10 else row[5] == "retry" and row[2] is not None
    return ConditionRecord(
        ConditionKind(row[0]),
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        epochs,
        row[7],
        row[8],
        workers,
        by_seq,
    )


class _Retained:
    """The retained raw events by position, to write an effect's copy of one as its position."""

    __slots__ = ("at",)

    def __init__(self, evidence: Evidence) -> None:
        self.at = {e.pos: e for e in evidence}

    def ref(self, record: EventRecord) -> EventRecord | int:
        kept = self.at.get(record.pos)
        if kept is not None and (kept is record or kept == record):
            return record.pos
        return record


def _effect_row(e: Effect, retained: _Retained) -> list[Any]:
    ref = retained.ref
    return [
        [ref(r) for r in e.firsts.values()],
        None if e.confirmed is None else sorted(e.confirmed),
        [[epoch, source, [ref(r) for r in evs]] for (epoch, source), evs in e.twice.items()],
        e.verified,
        [[epoch, kind, ref(r)] for (epoch, kind), r in e.lasts.items()],
    ]


def _effect(row: list[Any], retained: Evidence | Mapping[int, EventRecord]) -> Effect:
    """An effect from its row; an int in it is a retained event's index in the evidence (up to
    version 7) or its position (`retained` maps positions then)."""

    def record(r: list[Any] | int) -> EventRecord:
        return retained[r] if isinstance(r, int) else event_of(r)

    firsts = [record(r) for r in row[0]]
    return Effect(
        firsts={e.epoch: e for e in firsts},
        confirmed=None if row[1] is None else set(row[1]),
        twice={(epoch, source): [record(r) for r in evs] for epoch, source, evs in row[2]},
        verified=None if row[3] is None else marks_of(row[3]),
        lasts={(epoch, kind): record(r) for epoch, kind, r in row[4]},
    )


def _episode_row(ep: Episode) -> list[Any]:
    return [
        ep.displaced_epoch,
        ep.retry,
        ep.revision,
        ep.status.value,
        ep.severity.value,
        [_cond_row(c) for c in ep.listed.values()],
        ep.keys,
        ep.keys_over,
        ep.total,
        ep.activity,
        {k: [list(p) for p in pts] for k, pts in ep.pending.items()},
        ep.unconfirmed,
        ep.confirmations,
        ep.unanswered,
        None,  # was "an occurrence without seq" (to version 4): the ordering no longer reads it
        ep.first_stale,
        ep.stale,
        ep.latest,
        ep.last_stale_at,
        ep.shown,
        ep.digest,
        ep.worker,
        ep.truncated,
        ep.opened_at,
        ep.displaced_ctx,
        {k: [list(p) for p in pts] for k, pts in ep.dup_pending.items()},
    ]


# Episodes written before `opened_at` have three fields less (and read as not knowing it), those
# written before version 7 two (without `displaced_ctx` and `dup_pending`).
EPISODE_FIELDS: Final = 26


def _frontier(points: list[list[Any]]) -> list[Point]:
    """A key's pending points in the order `_episode._pend` keeps (states written before it
    kept them in arrival order, and without the event id that breaks a tie of seq)."""
    return sorted(
        ((p[0], p[1], p[2] if len(p) > 2 else LAST_ID) for p in points),
        key=lambda p: (p[0] is None, p[0] or 0, p[2]),
    )


def _episode(row: list[Any]) -> Episode:
    if len(row) not in (EPISODE_FIELDS - 3, EPISODE_FIELDS - 2, EPISODE_FIELDS):
        raise ValueError(f"damaged finding state: {len(row)} fields, not {EPISODE_FIELDS}")
    listed = [cond_of(c) for c in row[5]]
    return Episode(
        displaced_epoch=row[0],
        retry=row[1],
        revision=row[2],
        status=Status(row[3]),
        severity=Severity(row[4]),
        listed={(c.kind.value, c.effect_key, c.cause): c for c in listed},
        keys=row[6],
        keys_over=row[7],
        total=row[8],
        activity=row[9],
        pending={k: _frontier(pts) for k, pts in row[10].items()},
        unconfirmed=row[11],
        confirmations=row[12],
        unanswered=row[13],
        first_stale=_ev(row[15]),
        stale=None if row[16] is None else latest_of(row[16]),
        latest=None if row[17] is None else latest_of(row[17]),
        last_stale_at=row[18],
        shown=row[19],
        digest=row[20],
        worker=row[21],
        truncated=row[22],
        opened_at=row[23] if len(row) > 23 else None,
        displaced_ctx=context_row(row[24]) if len(row) > 24 else None,
        dup_pending={}
        if len(row) < EPISODE_FIELDS
        else {k: _frontier(p) for k, p in row[25].items()},
    )


def encode_state(state: WorkflowState) -> bytes:
    """Bytes for a changelog record; `decode_state` gives back an equal state."""
    return _ENCODER.encode(
        [
            STATE_VERSION,
            state.pos,
            state.max_seq,
            # Records are tuples in their field order: packed as arrays as they are.
            state.acqs,
            state.evidence,
            _forgotten_ids(state),
            _effect_rows(state),
            None if state.fences is None else list(state.fences.items()),
            [_episode_row(ep) for ep in state.episodes.values()],
            state.clock,
            state.cut,
            state.forgotten,
            state.blind_below,
            state.last_at,
            state.released_at,
            state.hb_obs,
            state.labels,
            state.lease_s,
            state.lease_until,
            None if state.uncertain is None else list(state.uncertain.items()),
            state.past,
        ]
    )


def _effect_rows(state: WorkflowState) -> list[list[Any]] | None:
    effects = state.effects
    if effects is None:
        return None
    retained: _Retained | None = None
    rows: list[list[Any]] = []
    for key, e in effects.items():
        packed = e.packed
        if packed is None:
            if retained is None:
                retained = _Retained(state.evidence)
            packed = e.packed = msgspec.Raw(_ENCODER.encode(_effect_row(e, retained)))
        rows.append([key, packed])
    return rows


def forget_packed(state: WorkflowState, gone: Iterable[EventRecord] | None = None) -> None:
    """Raw events were forgotten (`gone`; None: every one): the rows of the effects that may refer
    to one of them by its position are stale, those of the effects of their keys (an effect keeps
    only its own key's events). The others stay: the oldest events are forgotten every few events
    of a long-lived workflow at the caps, which keeps hundreds of effect keys."""
    effects = state.effects
    if not effects:
        return
    if gone is None:
        for e in effects.values():
            e.packed = None
        return
    for r in gone:
        if r.effect_key is not None and (changed := effects.get(r.effect_key)) is not None:
            changed.packed = None


def _forgotten_ids(state: WorkflowState) -> msgspec.Raw | None:
    """The ids index without what the retained records give back: most of it, most often. An id
    is `RETAINED` exactly while a retained record holds it, so its value tells."""
    ids = state.ids
    if ids is None:
        return None
    packed = state.ids_packed
    if packed is None:
        forgotten = {k: v for k, v in ids.items() if v != RETAINED}
        packed = state.ids_packed = msgspec.Raw(_ENCODER.encode(forgotten))
    return packed


def _ids(forgotten: dict[str, int], acqs: list[Any], evidence: list[Any]) -> dict[str, int]:
    """The ids index again: the forgotten ones (oldest first), then the retained records'."""
    ids = dict(forgotten)
    ids.update(dict.fromkeys(map(ACQ_ID, acqs), RETAINED))
    ids.update(dict.fromkeys(map(EVENT_ID, evidence), RETAINED))
    return ids


# Version 3 states written before `lease_until` have one field less, and a tool class alone
# where `labels` are now; versions 3 and 4 have no `uncertain`, versions 3 to 5 no `past`.
V3_FIELDS: Final = 21


# Decoded labels and lease durations, one object each for the states that share them (as the
# engine shares them: `LeaseHealth.stats_of`, `LeaseHealth._shared_lease`); bounded, the engine
# bounds labels again at their first use.
_SHARED_MAX: Final = 1024
_T = TypeVar("_T")
_SHARED_LABELS: Final[dict[Labels, Labels]] = {}
_SHARED_LEASES: Final[dict[float, float]] = {}


def _labels(value: list[str] | str | None) -> Labels | None:
    if value is None:
        return None
    if isinstance(value, str):
        labels = (intern(value), UNLABELLED, UNLABELLED)
    else:
        tool_class, model, provider = value
        labels = (intern(tool_class), intern(model), intern(provider))
    return _shared(_SHARED_LABELS, labels)


def _shared_lease(lease_s: float | None) -> float | None:
    return None if lease_s is None else _shared(_SHARED_LEASES, lease_s)


def _shared(shared: dict[_T, _T], value: _T) -> _T:
    found = shared.get(value)
    if found is not None:
        return found
    if len(shared) < _SHARED_MAX:
        shared[value] = value
    return value


def decode_v3(fields: list[Any]) -> WorkflowState:
    """A version 3 to 8 state from its unpacked fields (`detector.core.decode_state` reads
    any)."""
    if len(fields) not in range(V3_FIELDS - 3, V3_FIELDS + 1):
        raise ValueError(f"damaged workflow state: {len(fields)} fields, not {V3_FIELDS}")
    (
        _,
        pos,
        max_seq,
        acqs,
        evidence,
        ids,
        effects,
        fences,
        episodes,
        clock,
        cut,
        forgotten,
        blind_below,
        last_at,
        released_at,
        hb_obs,
        labels,
        lease_s,
    ) = fields[:18]
    if len(fields) > 18:
        lease_until = fields[18]
    else:  # written before `lease_until`: a release since the acquisition is all it tells
        lease_until = None if released_at is None else LEASE_RELEASED
    found = {ep.key: ep for ep in (_episode(r) for r in episodes)}
    retained = evidence_of(map(event_of, evidence))
    refs: Evidence | dict[int, EventRecord] = (
        retained if fields[0] <= INDEX_REFS_UNTIL else {e.pos: e for e in retained}
    )
    return WorkflowState(
        pos=pos,
        max_seq=max_seq,
        acqs=acquisitions_of(map(_acquisition, acqs)),
        evidence=retained,
        ids=None if ids is None else _ids(ids, acqs, evidence),
        effects=None if effects is None else {k: _effect(row, refs) for k, row in effects},
        fences=None if fences is None else {epoch: _fence_points(m) for epoch, m in fences},
        found=found or None,
        clock=None if clock is None else [_clock_entry(*entry) for entry in clock],
        cut=cut,
        forgotten=None if forgotten is None else marks_of(forgotten),
        blind_below=blind_below,
        last_at=last_at,
        released_at=released_at,
        hb_obs=hb_obs,
        lease_s=_shared_lease(lease_s),
        labels=_labels(labels),
        lease_until=lease_until,
        uncertain=None
        if len(fields) < 20 or fields[19] is None
        else {epoch: latest_of(row) for epoch, row in fields[19]},
        past=None
        if len(fields) < V3_FIELDS or fields[20] is None
        else tuple((e, r, n, s, d) for e, r, n, s, d in fields[20]),
    )


def _clock_entry(
    seq: int | None, pos: int, t: float | None, worker: str, source: str, at_seq: str = ""
) -> ClockEntry:
    """An entry as a state holds it; before version 5 without its place at its seq."""
    return (seq, pos, t, worker, source, at_seq)


def _fence_points(row: list[Any]) -> list[FencePoint]:
    """Fence points as a state holds them. Before version 5, marks: the highest seq (a point at
    the first id of that seq, arrived before every stale event without seq, so no later than
    the fence was) and the latest fence without seq."""
    if row and not isinstance(row[0], list):
        top_seq, unseq, _ = row[:3]
        points: list[FencePoint] = []
        if top_seq != NONE:
            points.append((top_seq, "", 0))
        if unseq != NONE:
            points.append((None, "", unseq))  # the one without seq comes last
        return points
    return sorted(((s, e, p) for s, e, p in row), key=lambda q: (q[0] is None, q[0] or 0, q[1]))
