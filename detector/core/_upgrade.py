"""Reading any state version: 3 to 8 as they are; 1 (JSON) and 2 by replaying their records.

Versions 1 and 2 kept raw records and rendered conditions only. Replaying the records through
today's rules rebuilds the compact state, and the published episodes keep their revisions, so a
restored finding goes on at its next revision and never publishes one twice.
"""

from __future__ import annotations

import json
from typing import Any, Final, NamedTuple

import msgspec

from detector.contracts.findings import Severity, Status

from ._config import Config
from ._engine import Detector
from ._episode import add_condition
from ._records import AcquisitionRecord, EventRecord
from ._state import (
    STATE_VERSION,
    WorkflowState,
    acquisitions_of,
    cond_of,
    decode_v3,
    evidence_of,
)

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


# Untyped: msgpack arrays as lists, as `decode_v3` and `_replay` index them. Reused, as msgspec
# recommends; a decoder keeps no state between calls.
_DECODER: Final = msgspec.msgpack.Decoder()


def decode_state(raw: bytes) -> WorkflowState:
    """A workflow state from changelog bytes of any version this code has written."""
    fields: list[Any]
    if raw[:1] == b"{":
        doc = json.loads(raw)
        version = doc.get("v")
        fields = [doc[name] for name in _V1_FIELDS] if version == 1 else []
    else:
        fields = _DECODER.decode(raw)
        version = fields[0] if isinstance(fields, list) and fields else None
    if version in (3, 4, 5, 6, 7, STATE_VERSION):  # one layout, grown; 3 without references
        return decode_v3(fields)
    if version not in (1, 2):
        raise ValueError(f"unknown workflow state version {version!r}")
    if len(fields) != len(_V1_FIELDS):
        raise ValueError(f"damaged workflow state: {len(fields)} fields, not {len(_V1_FIELDS)}")
    return _replay(fields)


def _replay(fields: list[Any]) -> WorkflowState:
    _, pos, max_seq, acqs, evidence, episodes, last_at, released_at, hb_obs, tool, lease = fields
    engine = Detector(Config.for_audit())
    st = WorkflowState(
        max_seq=max_seq,
        acqs=acquisitions_of(sorted((AcquisitionRecord(*a) for a in acqs), key=lambda a: a.epoch)),
        last_at=last_at,
        released_at=released_at,
        hb_obs=hb_obs,
        tool_class=tool,
        lease_s=lease,
    )
    records = sorted((EventRecord(*r) for r in evidence), key=lambda e: e.pos)
    st.evidence = evidence_of(records)
    # Every acquisition is in place first: staleness compares positions, not arrival.
    for ev in records:
        engine._intake.ingest(st, ev, None, False)
    for row in episodes:
        ep = st.episode((row[0], row[1]))
        for c in row[5]:
            cond = cond_of(c)
            seen = EventRecord(
                cond.event_id, "", row[0], cond.seq, cond.pos, cond.source, None, "", None
            )
            add_condition(ep, cond, seen, None, engine.config.max_effect_keys)
        ep.revision, ep.digest, ep.worker = row[2], row[8], row[9]
        ep.status = Status(row[3])
        ep.severity = max(ep.severity, Severity(row[4]), key=lambda s: s.rank)
        ep.last_stale_at = row[7]
        if ep.status is Status.RESOLVED:
            ep.pending.clear()  # its verifications may be among what version 2 forgot
    st.pos = pos
    return st


class SweepMarks(NamedTuple):
    """What `Detector.advance` needs of a state to pass it by (`SweptStates`)."""

    last_at: float | None  # idle from `idle_ttl_s` after it, expired from `remnant_ttl_s`
    watched: bool  # `WorkflowState.watched`
    remnant: bool  # `WorkflowState.remnant_only`: it expires instead

    @classmethod
    def of(cls, state: WorkflowState) -> SweepMarks:
        return cls(state.last_at, state.watched, state.remnant_only)


class _EpisodeGlance(msgspec.Struct, array_like=True):
    """An episode row (`_state._episode_row`) up to its status; the rest is skipped."""

    displaced_epoch: msgspec.Raw
    retry: msgspec.Raw
    revision: msgspec.Raw
    status: str


class _Glance(msgspec.Struct, array_like=True):
    """A state of version 3 or later (`_state.encode_state`), every field but those the sweep
    reads skipped unparsed (later fields are appended, so these keep their places; those that
    versions before 6 lack default to what they read as)."""

    version: int
    pos: msgspec.Raw
    max_seq: msgspec.Raw
    acqs: msgspec.Raw
    evidence: msgspec.Raw
    ids: msgspec.Raw
    effects: msgspec.Raw
    fences: msgspec.Raw
    episodes: list[_EpisodeGlance]
    clock: msgspec.Raw
    cut: msgspec.Raw
    forgotten: msgspec.Raw
    blind_below: msgspec.Raw
    last_at: float | None
    released_at: float | None
    hb_obs: msgspec.Raw = msgspec.Raw()
    labels: msgspec.Raw = msgspec.Raw()
    lease_s: msgspec.Raw = msgspec.Raw()
    lease_until: msgspec.Raw = msgspec.Raw()
    uncertain: msgspec.Raw = msgspec.Raw()
    past: list[msgspec.Raw] | None = None


_GLANCE: Final = msgspec.msgpack.Decoder(_Glance)


def sweep_marks(raw: bytes) -> SweepMarks:
    """A state's `SweepMarks` from its changelog bytes, at a twelfth of `decode_state`'s cost
    (`bench/bench_recovery.py`): a worker keeps restored states encoded until first used."""
    if raw[:1] != b"{":
        try:
            glance = _GLANCE.decode(raw)
        except msgspec.MsgspecError:  # versions 1 and 2, or damaged: decoding tells
            pass
        else:
            if 3 <= glance.version <= STATE_VERSION:
                watched = glance.released_at is not None or any(
                    ep.status == Status.OPEN.value for ep in glance.episodes
                )
                remnant = glance.past is not None and not glance.episodes
                return SweepMarks(glance.last_at, watched, remnant)
    return SweepMarks.of(decode_state(raw))
