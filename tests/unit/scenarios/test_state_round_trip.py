"""Workflow state: encode/decode round trips and earlier state versions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from detector.core import Config

from ..histories import W, acq, at, commit, ev, run, seed_history, takeover, verify


def test_state_survives_encode_decode_mid_episode() -> None:
    from detector.core import decode_state, encode_state  # noqa: PLC0415

    first = [*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=6)]
    rest = [
        commit("c", 17, "alpha", 7),
        ev("f", "lease_lost", W, 17, "alpha", seq=8),
        verify("v", 9),
    ]
    straight = run([*first, *rest])
    r = run(first)
    r.detector.states = {k: decode_state(encode_state(s)) for k, s in r.detector.states.items()}
    r.feed(rest)
    assert r.findings() == straight.findings()
    assert r.finding(W, 17).status.value == "resolved"


def test_open_findings_are_counted_by_severity_and_found_again_after_a_restore() -> None:
    from detector.contracts.findings import Severity  # noqa: PLC0415
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    first = [*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=6)]
    r = run([*first, commit("c", 17, "alpha", 7)])
    assert r.detector.open_findings()[Severity.CRITICAL] == 1
    assert sum(r.detector.open_findings().values()) == 1
    # A restored worker has a fresh detector: its first pass of time finds the open finding.
    restored = Detector(
        states={k: decode_state(encode_state(v)) for k, v in r.detector.states.items()}
    )
    restored.advance(at(40))
    assert restored.open_findings()[Severity.CRITICAL] == 1
    # Fenced and verified: resolved, no longer counted.
    r.feed([ev("f", "lease_lost", W, 17, "alpha", seq=8), verify("v", 9)])
    assert r.finding(W, 17).status.value == "resolved"
    assert sum(r.detector.open_findings().values()) == 0


def test_state_survives_encode_decode_at_every_length_of_retained_evidence() -> None:
    """Short evidence is held as a tuple, long as a list: both come back as they were."""
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    d = Detector(Config(max_evidence=12))
    d.observe(acq("a", 17, "alpha", 1))
    for seq in range(2, 40):
        d.observe(ev(f"hb{seq}", "heartbeat", W, 17, "alpha", seq=seq))
        state = d.states[W]
        assert decode_state(encode_state(state)) == state
        assert 0 < len(state.evidence) <= 12


def test_an_effect_record_also_retained_as_evidence_is_written_once() -> None:
    """Version 8 writes an effect's copy of a retained event as the event's position; the same
    state written as version 7 (its index in the evidence) or 3 (full copies) still decodes, to
    the same state."""
    import msgspec  # noqa: PLC0415

    from detector.core import decode_state, encode_state  # noqa: PLC0415

    r = run(seed_history())
    state = r.detector.states[W]
    fields = msgspec.msgpack.decode(encode_state(state))
    assert fields[0] == 8
    evidence, effects = fields[4], fields[6]
    references = [ref for _, row in effects for ref in row[0] if isinstance(ref, int)]
    assert references, "a commit retained as evidence is referenced, not copied"
    assert decode_state(encode_state(state)) == state
    assert decode_state(msgspec.msgpack.encode(_as_version_7(fields))) == state
    full_copies = _referring(fields, lambda pos: next(e for e in evidence if e[4] == pos))
    assert decode_state(msgspec.msgpack.encode([3, *full_copies[1:]])) == state


def _referring(fields: list[Any], ref: Callable[[int], object]) -> list[Any]:
    """A state's fields with each effect's reference to a retained event (an int) replaced."""

    def each(x: object) -> object:
        return ref(x) if isinstance(x, int) else x

    rows = [
        [
            key,
            [
                [each(x) for x in row[0]],
                row[1],
                [[epoch, source, [each(x) for x in evs]] for epoch, source, evs in row[2]],
                row[3],
                [[epoch, kind, each(x)] for epoch, kind, x in row[4]],
            ],
        ]
        for key, row in fields[6] or []
    ]
    return [*fields[:6], None if fields[6] is None else rows, *fields[7:]]


def _as_version_7(fields: list[Any]) -> list[Any]:
    """A version 8 state's fields as version 7 wrote them: an effect refers to a retained event
    by its index in the evidence, not its position."""
    index = {row[4]: i for i, row in enumerate(fields[4])}  # EventRecord.pos is its fifth field
    return [7, *_referring(fields, index.__getitem__)[1:]]


def test_forgetting_the_oldest_events_rewrites_only_the_effects_that_referred_to_them() -> None:
    """A long-lived workflow at the evidence cap forgets its oldest events every few events: an
    effect whose row refers to none of them keeps its row, and what is written with the rows kept
    is byte for byte what a state written afresh (a restored one) gives."""
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    d = Detector(Config(max_evidence=12))
    d.observe(acq("a", 17, "alpha", 1))
    kept_at_a_forget = 0
    for seq in range(2, 80):
        state = d.states[W]
        rows = {k: e.packed for k, e in (state.effects or {}).items()}
        retained = len(state.evidence)
        key = f"k{seq}" if seq % 3 == 0 else None
        kind = "effect_committed" if key else "heartbeat"
        d.observe(ev(f"e{seq}", kind, W, 17, "alpha", seq=seq, key=key))
        if len(state.evidence) < retained:
            effects = (state.effects or {}).items()
            kept_at_a_forget += sum(
                e.packed is not None and e.packed is rows.get(k) for k, e in effects
            )
        written = encode_state(state)
        assert decode_state(written) == state
        assert encode_state(decode_state(written)) == written
    assert kept_at_a_forget > 0


@pytest.mark.parametrize("name", ["state-v1-export-ledger.json", "state-v2-export-ledger.msgpack"])
def test_state_written_by_earlier_versions_still_decodes(name: str) -> None:
    """Changelogs written by versions 1 (JSON) and 2 (the records only) restore by replay: the
    same finding, and the next event continues it at its next revision, never republishing one."""
    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    r = run(seed_history())
    raw = (Path(__file__).parents[1] / "data" / name).read_bytes()
    restored = Detector(states={W: decode_state(raw.strip() if raw[:1] == b"{" else raw)})
    # Their records carry no context (version 7 on): the rest of the finding is the same.
    assert restored.findings() == [f.model_copy(update={"context": None}) for f in r.findings(W)]
    assert decode_state(encode_state(r.detector.states[W])) == r.detector.states[W]
    later = ev("e99", "heartbeat", W, 17, "worker-alpha", seq=99)
    (up,) = restored.observe(later)
    stale = up.finding.last_stale_event
    assert stale is not None and (up.finding.revision, stale.event_id) == (5, "e99")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b'{"v":9,"pos":1}', "unknown workflow state version 9"),
        (b"\x93\x09\x01\x02", "unknown workflow state version 9"),  # msgpack [9, 1, 2]
        (b"\x91\x02", "damaged workflow state: 1 fields"),  # msgpack [2]
    ],
)
def test_a_state_of_an_unknown_version_or_damaged_is_refused(raw: bytes, problem: str) -> None:
    from detector.core import decode_state  # noqa: PLC0415

    with pytest.raises(ValueError, match=problem):
        decode_state(raw)


def _as_version_4(fields: list[Any]) -> list[Any]:
    """A version 8 state's fields as version 4 wrote them (as version 7 did, and): marks of
    three, fences as marks, pending points of two, an episode's stale events and conditions as
    their latest record, clock entries of five, no `uncertain`."""

    def marks(m: list[Any] | None) -> list[Any] | None:
        return None if m is None else m[:3]

    def latest(s: list[Any] | None) -> list[Any] | None:
        if s is None:
            return None
        top, _, last = s
        found: list[Any] = top if top is not None and last[3] is not None else last
        return found

    old = [4, *_as_version_7(fields)[1:19]]
    effects = old[6] or []
    for _, row in effects:
        row[3] = marks(row[3])
    fences = old[7] or []
    for pair in fences:
        (seq, _, pos), *_ = sorted(pair[1], key=lambda p: (p[0] is not None, p[0] or 0))
        pair[1] = [-1 if seq is None else seq, pos if seq is None else -1, pos]
    for ep in old[8]:
        ep[10] = {k: [p[:2] for p in pts] for k, pts in ep[10].items()}
        ep[14] = False
        ep[16], ep[17] = latest(ep[16]), latest(ep[17])
    old[9] = None if old[9] is None else [entry[:5] for entry in old[9]]
    old[11] = marks(old[11])
    return old


@pytest.mark.parametrize("resolved", [True, False])
def test_a_version_4_state_still_decodes_and_goes_on(resolved: bool) -> None:
    import msgspec  # noqa: PLC0415

    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    first = [
        *takeover(),
        commit("c", 17, "alpha", 7),
        ev("f", "lease_lost", W, 17, "alpha", seq=8),
        *([verify("v", 9)] if resolved else []),
    ]
    r = run(first)
    fields = msgspec.msgpack.decode(encode_state(r.detector.states[W]))
    restored = Detector(states={W: decode_state(msgspec.msgpack.encode(_as_version_4(fields)))})
    assert restored.findings() == r.findings(W)
    later = commit("c2", 17, "alpha", 12, key="other")
    (up,) = restored.observe(later)
    (straight,) = r.detector.observe(later)
    assert up == straight


@pytest.mark.parametrize("resolved", [True, False])
def test_a_version_5_state_still_decodes_and_goes_on(resolved: bool) -> None:
    """Version 5 wrote no `past` (what a forgotten finding's later revisions need): its states
    read as they are, and the next event continues their findings exactly."""
    import msgspec  # noqa: PLC0415

    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    first = [
        *takeover(),
        commit("c", 17, "alpha", 7),
        ev("f", "lease_lost", W, 17, "alpha", seq=8),
        *([verify("v", 9)] if resolved else []),
    ]
    r = run(first)
    fields = _as_version_6(msgspec.msgpack.decode(encode_state(r.detector.states[W])))
    assert fields[0] == 6 and fields[-1] is None
    version_5 = msgspec.msgpack.encode([5, *fields[1:-1]])
    assert decode_state(version_5) == r.detector.states[W]
    restored = Detector(states={W: decode_state(version_5)})
    later = commit("c2", 17, "alpha", 12, key="other")
    (up,) = restored.observe(later)
    (straight,) = r.detector.observe(later)
    assert up == straight


def _as_version_6(fields: list[Any]) -> list[Any]:
    """A version 8 state's fields as version 6 wrote them (as version 7 did, and): records without
    their context (an acquisition's row of six, an event's of ten), episodes without
    `displaced_ctx` and `dup_pending`."""

    def event(row: Any) -> Any:
        return row[:10] if isinstance(row, list) else row  # an int: its index in the evidence

    def latest(row: list[Any] | None) -> list[Any] | None:
        if row is None:
            return None
        top, unseq, last = row
        return [None if top is None else event(top), unseq, event(last)]

    old = [6, *_as_version_7(fields)[1:]]
    old[3] = [a[:6] for a in old[3]]
    old[4] = [event(e) for e in old[4]]
    for _, row in old[6] or []:
        row[0] = [event(r) for r in row[0]]
        row[2] = [[epoch, source, [event(r) for r in evs]] for epoch, source, evs in row[2]]
        row[4] = [[epoch, kind, event(r)] for epoch, kind, r in row[4]]
    for ep in old[8]:
        ep[15] = None if ep[15] is None else event(ep[15])
        ep[16], ep[17] = latest(ep[16]), latest(ep[17])
        del ep[24:]
    old[19] = None if old[19] is None else [[epoch, latest(row)] for epoch, row in old[19]]
    return old


@pytest.mark.parametrize("resolved", [True, False])
def test_a_version_6_state_still_decodes_and_goes_on(resolved: bool) -> None:
    """Version 6 kept no context: its states read as they are (the records without one), and
    the next event continues their findings; context comes with the records made from then on."""
    import msgspec  # noqa: PLC0415

    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    first = [
        *takeover(),
        commit("c", 17, "alpha", 7),
        ev("f", "lease_lost", W, 17, "alpha", seq=8),
        *([verify("v", 9)] if resolved else []),
    ]
    r = run(first)
    version_6 = msgspec.msgpack.encode(
        _as_version_6(msgspec.msgpack.decode(encode_state(r.detector.states[W])))
    )
    assert decode_state(version_6) == r.detector.states[W]
    restored = Detector(states={W: decode_state(version_6)})
    later = commit("c2", 17, "alpha", 12, key="other", detail={"attempt": 3})
    (up,) = restored.observe(later)
    (straight,) = r.detector.observe(later)
    assert up == straight
    assert up.finding.context is not None
    assert up.finding.context.latest_condition == {"attempt": "3"}


def test_a_version_6_state_with_duplicates_still_decodes_and_goes_on() -> None:
    """Version 6 kept a failover duplicate's occurrences awaiting a verifier with the episode's
    own (`pending`) and wrote no `dup_pending`: its states read as they are, and a verification
    after every commit settles the duplicate as it would have."""
    import msgspec  # noqa: PLC0415

    from detector.core import Detector, decode_state, encode_state  # noqa: PLC0415

    first = [
        acq("a5", 5, "w5", 1),
        commit("c5", 5, "w5", 2),
        ev("r5", "lease_released", W, 5, "w5", seq=3),
        acq("a6", 6, "w6", 4),
        commit("c6", 6, "w6", 5),
    ]
    r = run(first)
    fields = msgspec.msgpack.decode(encode_state(r.detector.states[W]))
    assert fields[0] == 8
    for row in fields[8]:
        for key, points in row[25].items():  # as version 6 kept them
            row[10].setdefault(key, []).extend(points)
    version_6 = msgspec.msgpack.encode(_as_version_6(fields))
    restored = Detector(states={W: decode_state(version_6)})
    (before,) = [f for f in restored.findings() if f.displaced and f.displaced.owner_epoch == 5]
    assert before.status.value == "open"
    settle = verify("v", 6, epoch=6)
    (up,) = restored.observe(settle)
    (straight,) = r.detector.observe(settle)
    assert up == straight and up.finding.status.value == "resolved"
