"""Per-workflow state: what the rules need later, and its byte encoding for a changelog."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import msgpack

from detector.events import Kind
from detector.findings import ConditionKind, Severity, Status

from ._records import Acq, Cond, Ev

# 2: a msgpack array, five times faster to write than 1, a JSON object (still read). A worker
# writes its state to the changelog for nearly every event, so this is its largest cost.
STATE_VERSION: Final = 2

# Kinds retained as effect evidence (they decide duplicates and resolution); the rest is activity.
EFFECT_EVIDENCE: Final = frozenset(
    {Kind.EFFECT_ATTEMPTED, Kind.EFFECT_COMMITTED, Kind.EFFECT_REJECTED, Kind.OUTCOME_VERIFIED}
)


@dataclass(slots=True)
class Episode:
    """A published finding's memory: revisions only grow, conditions only accumulate."""

    displaced_epoch: int
    retry: bool
    revision: int = 0
    status: Status = Status.OPEN
    severity: Severity = Severity.INFO
    conditions: dict[tuple[str, str | None, str | None], Cond] = field(default_factory=dict)
    last_stale: Ev | None = None
    last_stale_at: float | None = None
    digest: int = 0
    worker: str | None = None
    # Not persisted: a cheap fingerprint of what the document is rendered from, so that evidence
    # which changes nothing (the thousandth stale heartbeat) costs no rendering.
    inputs: int | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> tuple[int, bool]:
        return (self.displaced_epoch, self.retry)


# Retained evidence: a tuple while short, which has no spare capacity (most workflows hold two or
# three records); a list from `LIST_FROM` records on, so that an append touches one record instead
# of copying the tuple and re-counting the references of every record in it.
Evidence = tuple[Ev, ...] | list[Ev]
LIST_FROM: Final = 8


def evidence_of(records: Iterable[Ev]) -> Evidence:
    kept = tuple(records)
    return kept if len(kept) < LIST_FROM else list(kept)


EpisodeKey = tuple[int, bool]
_NO_EPISODES: Final[Mapping[EpisodeKey, Episode]] = MappingProxyType({})


@dataclass(slots=True)
class WorkflowState:
    """Everything kept for one workflow key. Bounded by the engine's caps."""

    pos: int = 0
    max_seq: int = -1
    acqs: tuple[Acq, ...] = ()
    evidence: Evidence = ()
    # None until the first finding: most workflows never have one, and an empty dict costs 64 B.
    found: dict[EpisodeKey, Episode] | None = None
    last_at: float | None = None
    released_at: float | None = None
    hb_obs: float | None = None
    tool_class: str | None = None
    lease_s: float | None = None

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
        return ep

    @property
    def top(self) -> int:
        """The highest epoch acquired so far, or -1 before any acquisition."""
        return self.acqs[-1].epoch if self.acqs else -1

    def seen(self, event_id: str) -> bool:
        """Redelivery check over the retained window (its size is the engine's caps)."""
        return any(e.event_id == event_id for e in self.evidence) or any(
            a.event_id == event_id for a in self.acqs
        )


def _ev(row: list[Any]) -> Ev:
    return Ev(*row)


def _cond_row(c: Cond) -> list[Any]:
    return [
        c.kind.value,
        c.event_id,
        c.seq,
        c.pos,
        c.effect_key,
        c.cause,
        None if c.epochs is None else list(c.epochs),
        c.source,
        c.trace,
    ]


def _cond(row: list[Any]) -> Cond:
    epochs = None if row[6] is None else tuple(row[6])
    return Cond(
        ConditionKind(row[0]),
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        epochs,
        row[7],
        row[8],
    )


def encode_state(state: WorkflowState) -> bytes:
    """Bytes for a changelog record; `decode_state` gives back an equal state."""
    packed: bytes = msgpack.packb(
        [
            STATE_VERSION,
            state.pos,
            state.max_seq,
            # Records are tuples in their field order: packed as arrays as they are.
            state.acqs,
            state.evidence,
            [
                [
                    ep.displaced_epoch,
                    ep.retry,
                    ep.revision,
                    ep.status.value,
                    ep.severity.value,
                    [_cond_row(c) for c in ep.conditions.values()],
                    ep.last_stale,
                    ep.last_stale_at,
                    ep.digest,
                    ep.worker,
                ]
                for ep in state.episodes.values()
            ],
            state.last_at,
            state.released_at,
            state.hb_obs,
            state.tool_class,
            state.lease_s,
        ]
    )
    return packed


_V1_FIELDS: Final = (
    "v",
    "pos",
    "max_seq",
    "acqs",
    "evidence",
    "episodes",
    "last_at",
    "released_at",
    "hb_obs",
    "tool_class",
    "lease_s",
)


def _fields(raw: bytes) -> Sequence[Any]:
    """The fields of either version, in the order of version 2."""
    if raw[:1] == b"{":
        doc = json.loads(raw)
        version = doc.get("v")
        fields: Sequence[Any] = [doc[name] for name in _V1_FIELDS] if version == 1 else []
    else:
        fields = msgpack.unpackb(raw)
        version = fields[0] if isinstance(fields, list) and fields else None
    if version not in (1, STATE_VERSION):
        raise ValueError(f"unknown workflow state version {version!r}")
    if len(fields) != len(_V1_FIELDS):
        raise ValueError(f"damaged workflow state: {len(fields)} fields, not {len(_V1_FIELDS)}")
    return fields


def decode_state(raw: bytes) -> WorkflowState:
    (
        _,
        pos,
        max_seq,
        acqs,
        evidence,
        rows,
        last_at,
        released_at,
        hb_obs,
        tool_class,
        lease_s,
    ) = _fields(raw)
    episodes: dict[EpisodeKey, Episode] = {}
    for row in rows:
        conds = [_cond(c) for c in row[5]]
        ep = Episode(
            displaced_epoch=row[0],
            retry=row[1],
            revision=row[2],
            status=Status(row[3]),
            severity=Severity(row[4]),
            conditions={(c.kind.value, c.effect_key, c.cause): c for c in conds},
            last_stale=None if row[6] is None else _ev(row[6]),
            last_stale_at=row[7],
            digest=row[8],
            worker=row[9],
        )
        episodes[ep.key] = ep
    return WorkflowState(
        pos=pos,
        max_seq=max_seq,
        acqs=tuple(Acq(*a) for a in acqs),
        evidence=evidence_of(_ev(r) for r in evidence),
        found=episodes or None,
        last_at=last_at,
        released_at=released_at,
        hb_obs=hb_obs,
        tool_class=tool_class,
        lease_s=lease_s,
    )
