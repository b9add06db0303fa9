"""Properties of the engine over generated histories (every event carries a `seq`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.core import Config, Detector, FindingUpdate, decode_state, encode_state
from detector.events import OwnershipEvent
from detector.findings import Finding

from .histories import ev, generous
from .oracle import oracle

# SPLITBRAIN_EXAMPLES=5000 for a longer bug hunt
SETTINGS = settings(
    max_examples=int(os.environ.get("SPLITBRAIN_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
KEYS = ("k0", "k1", "k2")

# what an owner (current or displaced) may do, weighted by repetition
ACTIONS = (
    "heartbeat",
    "heartbeat",
    "progress",
    "effect_attempted",
    "effect_committed",
    "effect_committed",
    "effect_rejected",
    "outcome_verified",
    "outcome_verified",
    "lease_lost",
    "lease_lost",
    "lease_released",
    "ownership_uncertain",
)


# A generated history is a list of compact rows (so failing examples print readably):
# (workflow, seq, kind, epoch, effect_key | None, source)
Row = tuple[str, int, str, int, str | None, str]


def build(rows: Sequence[Row]) -> list[OwnershipEvent]:
    out = []
    for wf, seq, kind, epoch, key, source in rows:
        worker = "checker" if source == "verifier" else f"w{epoch}"
        out.append(
            ev(
                f"{wf}-{seq}",
                kind,
                wf,
                epoch,
                worker,
                seq=seq,
                key=key,
                source=source,
                t=float(seq),
            )
        )
    return out


def _row(wf: str, seq: int, kind: str, epoch: int, key: str, src: str) -> Row:
    if kind == "lease_acquired":
        return (wf, seq, kind, epoch, None, "coordinator")
    if kind == "outcome_verified":
        return (wf, seq, kind, epoch, key, "verifier")
    if kind == "effect_attempted":
        return (wf, seq, kind, epoch, key, "worker")
    if kind in ("effect_committed", "effect_rejected"):
        return (wf, seq, kind, epoch, key, src)
    return (wf, seq, kind, epoch, None, "worker")


@st.composite
def workflow(draw: st.DrawFn, wf: str) -> list[Row]:
    """A split-brain-prone history in seq order: 1-4 epochs, any acquired owner may act."""
    n = draw(st.integers(1, 4))
    first = draw(st.integers(0, 30))
    steps = draw(st.lists(st.integers(1, 3), min_size=n - 1, max_size=n - 1))
    epochs = [first]
    for s in steps:
        epochs.append(epochs[-1] + s)
    out: list[Row] = []
    seq = 0
    for i, epoch in enumerate(epochs):
        seq += 1
        out.append(_row(wf, seq, "lease_acquired", epoch, "", ""))
        acts = draw(
            st.lists(
                st.tuples(
                    st.integers(0, i),  # which acquired owner acts
                    st.booleans(),  # ... biased to the current one
                    st.sampled_from(ACTIONS),
                    st.sampled_from(KEYS),
                    st.sampled_from(("destination", "destination", "worker")),
                ),
                max_size=6,
            )
        )
        for who, current, kind, key, src in acts:
            seq += 1
            out.append(_row(wf, seq, kind, epoch if current else epochs[who], key, src))
    return out


@st.composite
def clean_workflow(draw: st.DrawFn, wf: str) -> list[Row]:
    """Handoffs only: each owner acts before the next takeover, each effect key once overall
    (a worker's claim plus the destination's confirmation allowed); after a takeover the old
    owner only says it lost or released, and verifiers may speak for any epoch."""
    n = draw(st.integers(1, 4))
    epochs = sorted(draw(st.sets(st.integers(0, 40), min_size=n, max_size=n)))
    out: list[Row] = []
    seq = 0
    for i, epoch in enumerate(epochs):
        seq += 1
        out.append(_row(wf, seq, "lease_acquired", epoch, "", ""))
        if i > 0:
            for kind in draw(
                st.lists(
                    st.sampled_from(("lease_lost", "lease_released", "ownership_uncertain")),
                    max_size=2,
                )
            ):
                seq += 1
                out.append(_row(wf, seq, kind, epochs[i - 1], "", ""))
        acts = draw(st.lists(st.sampled_from((*ACTIONS[:-3], "claim+confirm")), max_size=6))
        for j, kind in enumerate(acts):
            seq += 1
            key = f"e{epoch}-k{j}"
            if kind == "claim+confirm":
                out.append(_row(wf, seq, "effect_committed", epoch, key, "worker"))
                seq += 1
                out.append(_row(wf, seq, "effect_committed", epoch, key, "destination"))
            elif kind == "outcome_verified":
                out.append(_row(wf, seq, kind, draw(st.sampled_from(epochs[: i + 1])), key, ""))
            else:
                out.append(_row(wf, seq, kind, epoch, key, "destination"))
        if draw(st.booleans()):
            seq += 1
            fence = draw(st.sampled_from(("lease_lost", "lease_released")))
            out.append(_row(wf, seq, fence, epoch, "", ""))
    return out


def _several(one: Any) -> st.SearchStrategy[list[Row]]:
    @st.composite
    def several(draw: st.DrawFn) -> list[Row]:
        n = draw(st.integers(1, 3))
        return [e for i in range(n) for e in draw(one(f"wf{i}"))]

    return several()


split_brain_histories = _several(workflow)
clean_histories = _several(clean_workflow)


@st.composite
def arrivals(draw: st.DrawFn, histories: st.SearchStrategy[list[Row]]):
    """(history in seq order, the same rows in a random arrival order)."""
    rows = draw(histories)
    return rows, draw(st.permutations(rows))


def feed(events: Sequence[OwnershipEvent], config: Config | None = None):
    d = Detector(config=config or generous())
    updates: list[FindingUpdate] = []
    for e in events:
        updates.extend(d.observe(e))
    return d, updates


def final(findings: list[Finding]) -> list[dict[str, Any]]:
    return sorted(
        (f.model_dump(mode="json", exclude={"revision"}) for f in findings),
        key=lambda f: f["finding_id"],
    )


def order_free(findings: list[Finding], rows: Sequence[Row]) -> list[dict[str, Any]]:
    """`final`: with seq on every event, nothing may depend on arrival, confidence included."""
    return final(findings)


# (a) ---------------------------------------------------------------------------------------


@SETTINGS
@given(arrivals(split_brain_histories))
def test_arrival_order_does_not_change_final_findings(case):
    hist, shuffled = build(case[0]), build(case[1])
    in_order, _ = feed(hist)
    any_order, _ = feed(shuffled)
    assert order_free(any_order.findings(), case[0]) == order_free(in_order.findings(), case[0])


# (b) ---------------------------------------------------------------------------------------


@SETTINGS
@given(arrivals(split_brain_histories), st.data())
def test_redelivery_changes_nothing(case, data):
    shuffled = build(case[1])
    with_dups: list[OwnershipEvent] = []
    redelivered = 0
    for i, e in enumerate(shuffled):
        with_dups.append(e)
        for _ in range(data.draw(st.integers(0, 2), label=f"dups after {i}")):
            with_dups.append(data.draw(st.sampled_from(shuffled[: i + 1])))
            redelivered += 1
    once, once_updates = feed(shuffled)
    twice, twice_updates = feed(with_dups)
    assert twice_updates == once_updates
    assert twice.findings() == once.findings()
    assert twice.counters.redelivered == redelivered


# (c) ---------------------------------------------------------------------------------------


@SETTINGS
@given(arrivals(clean_histories))
def test_clean_handoffs_give_no_finding(case):
    shuffled = build(case[1])
    d, updates = feed(shuffled)
    assert updates == []
    assert d.findings() == []
    assert d.counters.findings_opened == 0


# (d) ---------------------------------------------------------------------------------------

RANK = {"info": 0, "warning": 1, "critical": 2}


@SETTINGS
@given(arrivals(split_brain_histories), st.data())
def test_revision_stream_is_gapless_unique_and_severity_never_drops(case, data):
    shuffled = build(case[1])
    # time passes (quiet period 60 s, 25 s per event) and advance() runs now and then, so
    # findings resolve and reopen along the way
    d = Detector(config=generous(quiet_period_s=60.0))
    updates: list[FindingUpdate] = []
    for i, e in enumerate(shuffled):
        updates.extend(d.observe(e, at=25.0 * i))
        if data.draw(st.booleans(), label=f"advance after {i}"):
            updates.extend(d.advance(25.0 * i + 10.0))
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


# (e) ---------------------------------------------------------------------------------------


def _engine_key(f: Finding) -> tuple[str, str, int]:
    if f.displaced is not None:
        return (f.workflow_key, "displaced", f.displaced.owner_epoch)
    (retry,) = {c.epochs[0] for c in f.conditions if c.cause == "retry" and c.epochs}
    return (f.workflow_key, "retry", retry)


@SETTINGS
@given(arrivals(split_brain_histories))
def test_oracle_agrees_with_engine(case):
    hist, shuffled = build(case[0]), build(case[1])
    d, _ = feed(shuffled)
    expected = oracle(hist)
    got = {_engine_key(f): f for f in d.findings()}
    assert set(got) == set(expected)
    for k, o in expected.items():
        f = got[k]
        assert {(c.kind.value, c.cause, c.effect_key) for c in f.conditions} == o.conditions, k
        witnesses = {(c.kind.value, c.cause, c.effect_key): c.seq for c in f.conditions}
        assert witnesses == o.witnesses, k
        assert f.severity.value == o.severity, k
        assert (f.current.owner_epoch if f.current else None) == o.current, k
        assert sorted(f.effect_keys) == sorted({key for _, _, key in o.conditions if key}), k
        assert f.ordering == "authoritative_seq"
        assert (f.status.value == "resolved") == o.resolved, k


# (f) ---------------------------------------------------------------------------------------


@SETTINGS
@given(arrivals(split_brain_histories), st.data())
def test_state_round_trip_mid_stream_changes_nothing(case, data):
    shuffled = build(case[1])
    cut = data.draw(st.integers(0, len(shuffled)), label="cut")
    straight, straight_updates = feed(shuffled)
    d, updates = feed(shuffled[:cut])
    d.states = {k: decode_state(encode_state(s)) for k, s in d.states.items()}
    for e in shuffled[cut:]:
        updates.extend(d.observe(e))
    assert updates == straight_updates
    assert d.findings() == straight.findings()


def test_oracle_reproduces_the_published_acceptance_history():
    from detector.events import parse_event_json  # noqa: PLC0415

    from .test_scenarios import SEED  # noqa: PLC0415

    lines = SEED.read_text().splitlines()
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
    assert (f.severity, f.current, f.resolved) == ("critical", 18, False)
