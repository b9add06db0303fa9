"""Properties of the engine over generated histories, checked against the brute-force oracle.

Histories come from `gen` (see its docstring for the seq and arrival modes). Unless a test says
otherwise the engine runs as `audit` does: `observe(event)` without a caller time, then
`finish()`, so the oracle models the quiet period on believed `observed_at` times.

The example budget is the hypothesis profile's (tests/conftest.py: `ci`, `dev`, `slow`); the long
histories run a fifth of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Condition, Finding
from detector.core import Config, Detector, FindingUpdate, decode_state, encode_state

from .gen import (
    Row,
    build,
    clean_workflow,
    history,
    long_history,
    several,
    small_workflow,
)
from .histories import BASE_TS
from .oracle import CondKey, FKey, OracleFinding, disbelieved_count, oracle
from .regressions import FINDING_WITHOUT_REVISION, FINDING_WITHOUT_REVISION_TICKS, authoritative
from .runners import audit, audit_config, final, share_of_budget

LONG = share_of_budget(5)
SEEDS = st.integers(0, 2**32 - 1)
FUTURE = datetime(2099, 1, 1, tzinfo=UTC).timestamp() - BASE_TS  # an emitter's clock in 2099


# ---- running the engine -----------------------------------------------------------------------


def truncated_workflows(d: Detector) -> set[str]:
    return set(d.truncated_workflows())


def truncated(f: Finding) -> bool:
    return f.evidence_truncated


# ---- comparing with the oracle ----------------------------------------------------------------


def cond_key(c: Condition) -> CondKey:
    return (c.kind.value, c.cause, c.effect_key)


def engine_key(f: Finding) -> FKey:
    if f.displaced is not None:
        return (f.workflow_key, "displaced", f.displaced.owner_epoch)
    retried = {c.epochs[0] for c in f.conditions if c.cause == "retry" and c.epochs}
    if len(retried) == 1:
        return (f.workflow_key, "retry", retried.pop())
    return (f.workflow_key, "retry", f.current.owner_epoch if f.current else -1)


def invented(f: Finding, o: OracleFinding | None) -> list[str]:
    """What the engine reports that the oracle does not: never acceptable, caps or not."""
    if o is None:
        return [f"{engine_key(f)}: a finding the oracle does not have: {brief(f)}"]
    extra = {cond_key(c) for c in f.conditions} - o.conditions
    if not extra:
        return []
    return [f"{engine_key(f)}: conditions the oracle does not have: {sorted(map(str, extra))}"]


def differences(f: Finding, o: OracleFinding) -> list[str]:
    """Every field the oracle defines and the engine gets otherwise (see oracle.py)."""
    k = engine_key(f)
    out: list[str] = []
    listed = {cond_key(c): c for c in f.conditions}
    skipped = f.conditions_omitted
    if not skipped and set(listed) != o.conditions:
        missing = o.conditions - set(listed)
        out.append(f"{k}: conditions missing: {sorted(map(str, missing))}")
    if skipped and len(listed) + skipped != len(o.conditions):
        out.append(f"{k}: {len(listed)} listed + {skipped} omitted != {len(o.conditions)}")
    if o.witness is not None:
        for ck, c in listed.items():
            w = o.witness.get(ck)
            if w is not None and c.event_id != w.event_id:
                out.append(f"{k}: witness of {ck}: {c.event_id}, oracle {w.event_id}")
    if f.severity.value != o.severity:
        out.append(f"{k}: severity {f.severity.value}, oracle {o.severity}")
    if o.resolved is not None and (f.status.value == "resolved") != o.resolved:
        out.append(f"{k}: status {f.status.value}, oracle resolved={o.resolved}")
    current = f.current.owner_epoch if f.current else None
    if current != o.current:
        out.append(f"{k}: current {current}, oracle {o.current}")
    ordering = o.ordering
    if skipped and o.placed is not None:
        # §4: the ordering is taken from the listed conditions
        placed = [o.placed[ck] for ck in listed]
        by_seq = any(placed)
        ordering = "authoritative_seq" if by_seq else "arrival"
    if o.confidence is not None and ordering == o.ordering and f.confidence != o.confidence:
        out.append(f"{k}: confidence {f.confidence}, oracle {o.confidence}")
    if ordering is not None and f.ordering != ordering:
        out.append(f"{k}: ordering {f.ordering}, oracle {ordering}")
    keys = set(f.effect_keys)
    more = f.effect_keys_omitted
    if not keys <= o.effect_keys or len(keys) + more != len(o.effect_keys):
        out.append(f"{k}: effect keys {sorted(keys)} (+{more}), oracle {sorted(o.effect_keys)}")
    if o.last_stale is not None and (
        f.last_stale_event is None or f.last_stale_event.event_id != o.last_stale.event_id
    ):
        got = f.last_stale_event.event_id if f.last_stale_event else None
        out.append(f"{k}: last stale event {got}, oracle {o.last_stale.event_id}")
    if o.transition is not None and (
        f.transition is None or f.transition.event_id != o.transition.event_id
    ):
        got = f.transition.event_id if f.transition else None
        out.append(f"{k}: transition {got}, oracle {o.transition.event_id}")
    if f.evidence_lag is not None and (f.evidence_lag.seq or 0) < 0:
        out.append(f"{k}: negative evidence_lag.seq {f.evidence_lag.seq}")
    return out


def brief(f: Finding) -> str:
    conds = sorted(f"{c.kind.value}/{c.cause}/{c.effect_key}@{c.event_id}" for c in f.conditions)
    return f"{f.severity.value} {f.status.value} {conds}"


def check(d: Detector, expected: dict[FKey, OracleFinding], *, capped: bool = False) -> list[str]:
    """Problems of the engine's final findings against the oracle's.

    Exact (capped=False): equal, and nothing truncated. Capped (DESIGN §4 Retention): nothing
    invented, a truncated finding is never high, a finding that differs says
    `evidence_truncated`, and a missing one is in a workflow `truncated_workflows()` names.
    """
    findings = d.findings()
    got = {engine_key(f): f for f in findings}
    problems: list[str] = []
    if len(got) != len(findings):
        problems.append(f"two findings for one episode: {[engine_key(f) for f in findings]}")
    cut = truncated_workflows(d)
    if not capped and cut:
        problems.append(f"truncated with audit caps: {sorted(cut)}")
    for k, f in got.items():
        problems += invented(f, expected.get(k))
        if truncated(f) and f.confidence == "high":
            problems.append(f"{k}: evidence_truncated yet confidence high")
        if truncated(f) and not capped:
            problems.append(f"{k}: evidence_truncated with audit caps")
    for k, o in expected.items():
        mine = got.get(k)
        if mine is None:
            # a finding that does not exist yet can hide behind a cut: the workflow is named
            if not (capped and k[0] in cut):
                problems.append(f"{k}: missing ({o.severity}, {sorted(map(str, o.conditions))})")
            continue
        # a finding whose evidence was cut says so itself
        if not (capped and truncated(mine)):
            problems += differences(mine, o)
    return problems


def assert_matches(events: Sequence[OwnershipEvent], d: Detector, *, capped: bool = False) -> None:
    problems = check(d, oracle(events), capped=capped)
    assert not problems, "\n".join(problems)


# ---- (a), (b): long workflows -----------------------------------------------------------------

LONG_MODES = st.sampled_from(
    [("all", "seq"), ("tied", "seq"), ("mixed", "acyclic"), ("none", "in_order")]
)


@LONG
@given(SEEDS, LONG_MODES)
def test_long_workflows_equal_the_oracle_with_audit_caps(seed: int, mode: tuple[str, str]) -> None:
    """Hundreds of events per workflow: with audit's caps nothing is cut, everything is exact."""
    _, arrived = long_history(seed, *mode)
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)


@LONG
@given(SEEDS, LONG_MODES)
def test_long_workflows_with_worker_caps_never_invent_and_flag_what_they_miss(
    seed: int, mode: tuple[str, str]
) -> None:
    """DESIGN §4 Retention: caps bound memory, never make a verdict silently wrong."""
    _, arrived = long_history(seed, *mode)
    events = build(arrived)
    d, _ = audit(events, Config())
    assert_matches(events, d, capped=True)


# ---- (c): arrival order with seq on every event -----------------------------------------------


@given(history("all", "seq"))
def test_seq_histories_equal_the_oracle_in_any_arrival_order(
    case: tuple[list[Row], list[Row]],
) -> None:
    _, arrived = case
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)


@given(history("all", "seq"))
def test_arrival_order_does_not_change_final_findings_statuses_included(
    case: tuple[list[Row], list[Row]],
) -> None:
    hist, arrived = case
    in_order, _ = audit(build(hist))
    any_order, _ = audit(build(arrived))
    assert final(any_order.findings()) == final(in_order.findings())


@given(history("tied", "seq"))
def test_tied_seq_histories_equal_the_oracle_in_any_arrival_order(
    case: tuple[list[Row], list[Row]],
) -> None:
    """DESIGN §4: two events at one seq are ordered, an acquisition first, then by event_id;
    arrival never decides between them."""
    hist, arrived = case
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)
    in_order, _ = audit(build(hist))
    assert final(d.findings()) == final(in_order.findings())


@given(history("tied", "acq_last"))
def test_acquisitions_arriving_after_what_they_displace_equal_the_oracle(
    case: tuple[list[Row], list[Row]],
) -> None:
    """§4: an acquisition that arrives after the stale events it displaces still finds them,
    ties included."""
    hist, arrived = case
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)
    in_order, _ = audit(build(hist))
    assert final(d.findings()) == final(in_order.findings())


@LONG
@given(SEEDS, st.sampled_from(["all", "tied"]))
def test_long_arrival_order_does_not_change_final_findings(seed: int, seq: str) -> None:
    hist, arrived = long_history(seed, seq, "seq")
    in_order, _ = audit(build(hist))
    any_order, _ = audit(build(arrived))
    assert final(any_order.findings()) == final(in_order.findings())


# ---- (d): mixed seq / no seq ------------------------------------------------------------------


@given(history("mixed", "acyclic"))
def test_mixed_seq_histories_equal_the_oracle(case: tuple[list[Row], list[Row]]) -> None:
    """Seq events arrive in any order between the events without seq: the pairwise rule of
    §4 is then a total order and every field is defined."""
    _, arrived = case
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)


@given(history("none", "in_order"))
def test_histories_without_seq_equal_the_oracle(case: tuple[list[Row], list[Row]]) -> None:
    _, arrived = case
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)


@given(history("mixed", "any"))
def test_any_mixed_arrival_agrees_on_what_is_pairwise(case: tuple[list[Row], list[Row]]) -> None:
    """Whatever the arrival (the pairwise relation may be cyclic), what §4 defines pairwise is
    what the pairwise rule gives: the findings, their conditions and severities, the last stale
    event, the fences and so the status, the latest condition and so `current`, the ordering."""
    _, arrived = case
    events = build(arrived)
    d, _ = audit(events)
    assert_matches(events, d)


# ---- (e): identity ----------------------------------------------------------------------------

MUTATIONS = st.sampled_from(("seq+", "seq-", "kind", "epoch", "key", "same"))


def redelivered(r: Row, how: str, top_seq: int) -> Row:
    """The same event id with other coordinates or content."""
    if how == "seq+":
        return r._replace(seq=top_seq + 1000)
    if how == "seq-":
        return r._replace(seq=0 if r.seq is not None else None)
    if how == "kind":
        kind = "effect_committed" if r.kind != "effect_committed" else "heartbeat"
        return r._replace(kind=kind, key="k0" if kind == "effect_committed" else None)
    if how == "epoch":
        return r._replace(epoch=r.epoch + 50 if r.kind == "lease_acquired" else 0)
    if how == "key":
        return r._replace(key="k-other" if r.key else None)
    return r


@given(st.sampled_from([("all", "seq"), ("mixed", "acyclic"), ("none", "in_order")]), st.data())
def test_redelivered_ids_change_nothing_whatever_their_seq_or_content(
    mode: tuple[str, str], data: st.DataObject
) -> None:
    _, arrived = data.draw(history(*mode), label="history")
    top = max((r.seq for r in arrived if r.seq is not None), default=0)
    with_dups: list[Row] = []
    for i, r in enumerate(arrived):
        with_dups.append(r)
        for _ in range(data.draw(st.integers(0, 2), label=f"redeliveries after {i}")):
            again = data.draw(st.sampled_from(arrived[: i + 1]), label="which")
            with_dups.append(redelivered(again, data.draw(MUTATIONS, label="how"), top))
    once, once_updates = audit(build(arrived))
    twice, twice_updates = audit(build(with_dups))
    assert twice_updates == once_updates
    assert twice.findings() == once.findings()
    assert_matches(build(with_dups), twice)


# ---- clean handoffs ---------------------------------------------------------------------------


@given(st.data())
def test_clean_handoffs_give_no_finding(data: st.DataObject) -> None:
    per_wf = data.draw(several(clean_workflow))
    rows = [r for wf in per_wf for r in wf]
    arrived = data.draw(st.permutations(rows))
    assert oracle(build(arrived)) == {}
    d, updates = audit(build(arrived))
    assert updates == []
    assert d.findings() == []
    assert d.counters.findings_opened == 0


# ---- (f): clocks ------------------------------------------------------------------------------


def future_workflow(t: float) -> list[Row]:
    """An unrelated workflow whose emitters agree the time is `t` (so it is believed there)."""
    return [
        Row("zz-future", "zf-1", "lease_acquired", 1, "wz", "coordinator", 1, None, t),
        Row("zz-future", "zf-2", "heartbeat", 1, "wz", "worker", 2, None, t + 1),
        Row("zz-future", "zf-3", "lease_acquired", 2, "wy", "coordinator", 3, None, t + 2),
        Row("zz-future", "zf-4", "heartbeat", 2, "wy", "worker", 4, None, t + 3),
    ]


def own(findings: list[Finding], wfs: set[str]) -> list[dict[str, Any]]:
    return final([f for f in findings if f.workflow_key in wfs])


@given(history("all", "seq"), st.data())
def test_another_workflows_far_future_clock_never_resolves_anything(
    case: tuple[list[Row], list[Row]], data: st.DataObject
) -> None:
    """§4 Time and silence: the quiet period is per workflow, in audit and in a worker."""
    _, arrived = case
    wfs = {r.wf for r in arrived}
    extra = future_workflow(FUTURE)
    slots = sorted(data.draw(st.lists(st.integers(0, len(arrived)), min_size=4, max_size=4)))
    mixed = list(arrived)
    for pos, r in zip(reversed(slots), reversed(extra), strict=True):
        mixed.insert(pos, r)
    alone, _ = audit(build(arrived))
    together, _ = audit(build(mixed))
    assert own(together.findings(), wfs) == own(alone.findings(), wfs)
    # A worker: its own clock (the caller's `at`) measures silence, never an emitter's.
    times = [BASE_TS + 10.0 * i for i in range(len(mixed))]
    w_alone, w_together = Detector(config=audit_config()), Detector(config=audit_config())
    for e, at in zip(build(mixed), times, strict=True):
        w_together.observe(e, at=at)
        if e.workflow_key in wfs:
            w_alone.observe(e, at=at)
    for w in (w_alone, w_together):
        w.advance(times[-1] + 1.0)
    assert own(w_together.findings(), wfs) == own(w_alone.findings(), wfs)


@given(history("all", "seq"), st.data())
def test_a_single_far_future_time_in_a_workflow_is_not_believed(
    case: tuple[list[Row], list[Row]], data: st.DataObject
) -> None:
    """One event from 2099 by the workflow's own top owner, last in its order: not believed
    (nothing else reports a time near it), so it changes nothing, and it is counted."""
    _, arrived = case
    wf = data.draw(st.sampled_from(sorted({r.wf for r in arrived})), label="workflow")
    mine = [r for r in arrived if r.wf == wf]
    top = max(r.epoch for r in mine if r.kind == "lease_acquired")
    last = max(r.seq or 0 for r in mine)
    future = Row(wf, f"{wf}-future", "heartbeat", top, f"w{top}", "worker", last + 1, None, FUTURE)
    pos = data.draw(st.integers(0, len(arrived)), label="arrives at")
    with_future = [*arrived[:pos], future, *arrived[pos:]]
    without_time = [*arrived[:pos], future._replace(t=None), *arrived[pos:]]
    d, _ = audit(build(with_future))
    d_none, _ = audit(build(without_time))
    assert final(d.findings()) == final(d_none.findings())
    assert_matches(build(with_future), d)
    assert disbelieved_count(build(with_future)) >= 1
    assert d.counters.times_disbelieved >= 1


# ---- revisions (worker mode) ------------------------------------------------------------------

RANK = {"info": 0, "warning": 1, "critical": 2}


@given(history("all", "seq"), st.lists(st.booleans(), max_size=90))
@example(
    (authoritative(FINDING_WITHOUT_REVISION), FINDING_WITHOUT_REVISION),
    FINDING_WITHOUT_REVISION_TICKS,
)
def test_revision_stream_is_gapless_unique_and_severity_never_drops(
    case: tuple[list[Row], list[Row]], advance_after: list[bool]
) -> None:
    _, arrived = case
    # time passes (quiet period 60 s, 25 s per event) and advance() runs now and then, so
    # findings resolve and reopen along the way
    d = Detector(config=Config(quiet_period_s=60.0))
    updates: list[FindingUpdate] = []
    for i, e in enumerate(build(arrived)):
        updates.extend(d.observe(e, at=BASE_TS + 25.0 * i))
        if i < len(advance_after) and advance_after[i]:
            updates.extend(d.advance(BASE_TS + 25.0 * i + 10.0).updates)
    seen: set[tuple[str, int]] = set()
    last: dict[str, Finding] = {}
    for u in updates:
        f = u.finding
        assert (f.finding_id, f.revision) not in seen
        seen.add((f.finding_id, f.revision))
        prev = last.get(f.finding_id)
        assert f.revision == (prev.revision + 1 if prev else 1)
        if prev is not None:
            assert RANK[f.severity.value] >= RANK[prev.severity.value]
            assert f.workflow_key == prev.workflow_key
            assert f.displaced == prev.displaced
        last[f.finding_id] = f
    assert sorted(last) == sorted(f.finding_id for f in d.findings())
    for f in d.findings():
        assert f == last[f.finding_id]


# ---- (g): state round trip --------------------------------------------------------------------


def replay(
    d: Detector, events: Sequence[OwnershipEvent], start: int, worker: bool
) -> list[FindingUpdate]:
    """Feed events numbered from `start`: as audit does, or as a worker at 25 s per event."""
    updates: list[FindingUpdate] = []
    for i, e in enumerate(events, start):
        updates.extend(d.observe(e, at=BASE_TS + 25.0 * i if worker else None))
    return updates


def finish(d: Detector, n: int, worker: bool) -> list[FindingUpdate]:
    return d.advance(BASE_TS + 25.0 * n + 700.0).updates if worker else d.finish()


@given(
    history("mixed", "acyclic"),
    st.sampled_from(["audit-caps", "worker-caps"]),
    st.booleans(),
    st.data(),
)
def test_state_round_trip_mid_history_changes_nothing(
    case: tuple[list[Row], list[Row]], caps: str, worker: bool, data: st.DataObject
) -> None:
    """A partition moving to another detector worker mid-history (its state through the
    changelog encoding) ends with the same findings and revisions, in audit and worker mode."""
    _, arrived = case
    events = build(arrived)
    config = audit_config() if caps == "audit-caps" else Config()
    cut = data.draw(st.integers(0, len(events)), label="cut")
    straight = Detector(config=config)
    straight_updates = replay(straight, events, 0, worker)
    straight_updates += finish(straight, len(events), worker)
    first = Detector(config=config)
    updates = replay(first, events[:cut], 0, worker)
    moved = {k: decode_state(encode_state(s)) for k, s in first.states.items()}
    second = Detector(config=config, states=moved)
    updates += replay(second, events[cut:], cut, worker)
    updates += finish(second, len(events), worker)
    assert updates == straight_updates
    assert second.findings() == straight.findings()
    assert second.truncated_workflows() == straight.truncated_workflows()


@LONG
@given(SEEDS, LONG_MODES, st.sampled_from([4, 8, 32]))
def test_a_state_written_at_every_event_reads_back_as_it_is(
    seed: int, mode: tuple[str, str], max_evidence: int
) -> None:
    """A worker writes a workflow's state at every transaction that touched it, and reuses the
    rows of effects that did not change: what it writes must read back as the live state at any
    point, through commits, verifications, late acquisitions and raw events forgotten, and be
    byte for byte what the same state written afresh (restored, no row kept) gives."""
    _, arrived = long_history(seed, *mode)
    d = Detector(config=Config(max_evidence=max_evidence))
    for i, e in enumerate(build(arrived)):
        d.observe(e, at=BASE_TS + 25.0 * i)
        state = d.states.get(e.workflow_key)
        if state is not None:
            written = encode_state(state)
            assert decode_state(written) == state, f"after event {i}"
            assert encode_state(decode_state(written)) == written, f"after event {i}"


# ---- the oracle itself ------------------------------------------------------------------------


@share_of_budget(4)
@given(st.data())
def test_oracle_does_not_depend_on_arrival_with_seq(data: st.DataObject) -> None:
    """The oracle's own contract: with seq on every event, arrival changes nothing."""
    per_wf = data.draw(several(small_workflow, "all"))
    rows = [r for wf in per_wf for r in wf]
    a, b = (build(data.draw(st.permutations(rows))) for _ in range(2))
    assert _summary(oracle(a)) == _summary(oracle(b))


def _summary(found: dict[FKey, OracleFinding]) -> dict[FKey, tuple[object, ...]]:
    return {
        k: (o.severity, o.witnesses, o.current, o.resolved, o.confidence) for k, o in found.items()
    }


def test_oracle_reproduces_the_published_acceptance_history() -> None:
    from detector.contracts.events import parse_event_json  # noqa: PLC0415
    from tests.paths import SEED_FIXTURE  # noqa: PLC0415

    lines = SEED_FIXTURE.read_text().splitlines()
    found = oracle(parse_event_json(line) for line in lines if line.strip())
    assert set(found) == {("export-ledger", "displaced", 17)}
    f = found[("export-ledger", "displaced", 17)]
    key = "release-index/2026-07-26"
    assert f.witnesses == {
        ("stale_activity", None, None): 6,
        ("stale_effect_attempt", None, key): 7,
        ("stale_effect_committed", None, key): 8,
        ("duplicate_effect", "failover", key): 9,
    }
    assert (f.severity, f.current, f.resolved, f.confidence) == ("critical", 18, False, "high")
    assert (f.transition and f.transition.event_id, f.last_stale and f.last_stale.event_id) == (
        "e05",
        "e08",
    )
