"""DESIGN §4 "Retention": every bounded or lazily built memory is exact, or the finding it could
change says `evidence_truncated` (and is never `high`); and "Work per event ...": every revision
stays under 64 KiB encoded, a long value cut and said so.

Each test pushes one memory past its bound — the times awaiting a vouch, the ids of a small
workflow's first events, the unverified occurrences of a key, the raw events a late acquisition
looks back at, the acquisitions, ids and effect keys at lowered caps — and checks the engine
against the brute-force oracle: exact with `audit`'s caps, or flagged where a cap bites.
"""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from detector.contracts.events import OwnershipEvent
from detector.core import Config

from .gen import Row, build, history, long_history
from .histories import ev
from .runners import audit
from .test_properties import LONG, SEEDS, assert_matches

HOUR = 3600.0
WF = "tenant-7/export/2026-07-26"


def takeover(stale_kind: str = "progress", key: str | None = None) -> list[OwnershipEvent]:
    """Epoch 1 displaced by epoch 2 at seq 2, then acting once (seq 3): a finding that is
    resolved only by silence (no fence, nothing to verify for activity)."""
    return [
        ev("a1", "lease_acquired", WF, 1, "w1", seq=1, t=0.0),
        ev("a2", "lease_acquired", WF, 2, "w2", seq=2, t=1.0),
        ev("s1", stale_kind, WF, 1, "w1", seq=3, key=key, t=2.0),
    ]


# ---- the times awaiting a vouch (audit's silence) ---------------------------------------------


@given(
    st.integers(60, 300),  # doubted times of one emitter, more than any fixed bound kept
    st.data(),
)
def test_doubted_times_are_all_kept_until_vouched(doubted: int, data: st.DataObject) -> None:
    """A clock two hours ahead reports many times; another worker then vouches for one of
    them (the earliest, the latest or any): the finding goes quiet or stays open as the
    oracle says, and nothing is flagged."""
    events = takeover()
    seq = 4
    for i in range(doubted):
        events.append(ev(f"f{i}", "heartbeat", WF, 2, "w2", seq=seq, t=2 * HOUR + 10 * i))
        seq += 1
    vouched = data.draw(st.sampled_from([0, doubted - 1, doubted // 2]), label="vouched")
    offset = data.draw(st.sampled_from([0.0, 0.5 * HOUR, -0.5 * HOUR]), label="offset")
    t = 2 * HOUR + 10 * vouched + offset
    events.append(ev("v", "heartbeat", WF, 2, "w3", seq=seq, source="coordinator", t=t))
    d, _ = audit(events)
    assert_matches(events, d)


def test_more_doubting_emitters_than_kept_flag_the_findings_that_hinge_on_silence() -> None:
    """Past the emitters whose doubted times are kept, a finding that could go quiet on a
    forgotten one says its evidence is cut, and is never high."""
    events = takeover()
    for i in range(100):  # each a worker of its own, two hours ahead
        events.append(ev(f"f{i}", "heartbeat", WF, 2, f"x{i}", seq=4 + i, t=2 * HOUR + i))
    d, _ = audit(events)
    (f,) = d.findings()
    assert f.status.value == "resolved"  # the emitters vouch for each other
    assert_matches(events, d)


# ---- the ids of a small workflow's first events ------------------------------------------------


@given(history("all", "seq", most=1), st.data())
def test_a_folded_acquisitions_id_is_remembered_in_a_small_workflow(
    case: tuple[list[Row], list[Row]], data: st.DataObject
) -> None:
    """An acquisition folded into another of its epoch goes, its id stays: when the id comes
    again (redelivered, or on another kind), it changes nothing."""
    _, arrived = case
    acquisitions = [r for r in arrived if r.kind == "lease_acquired"]
    if not acquisitions:
        return
    a = data.draw(st.sampled_from(acquisitions), label="epoch")
    top = max((r.seq or 0) for r in arrived)
    seq = data.draw(st.integers(0, top + 2), label="seq")
    assume(all(r.seq != seq for r in arrived))  # ties are another question (DESIGN §4)
    folded = a._replace(id="folded", seq=seq, t=None)
    at = data.draw(st.integers(0, len(arrived)), label="at")
    rows = [*arrived[:at], folded, *arrived[at:]]
    again = data.draw(
        st.sampled_from(
            [
                folded,
                folded._replace(kind="effect_committed", key="k0", source="worker", epoch=0),
                folded._replace(kind="progress", source="worker", epoch=0, seq=top + 3),
            ]
        ),
        label="again",
    )
    rows.insert(data.draw(st.integers(rows.index(folded) + 1, len(rows)), label="later"), again)
    events = build(rows)
    d, _ = audit(events)
    assert_matches(events, d)


# ---- the unverified occurrences of a key -------------------------------------------------------


@given(st.integers(17, 80), st.data())
def test_out_of_order_occurrences_wait_for_verification_exactly(
    n: int, data: st.DataObject
) -> None:
    """Stale commits of one key arriving in falling seq order (each one a point of the
    frontier), verifications at any seq among them: resolved exactly when the oracle says."""
    events = takeover("effect_attempted", "k")
    base = 10
    for i in range(n):
        events.append(
            ev(
                f"c{i}",
                "effect_rejected",
                WF,
                1,
                "d",
                seq=base + 2 * (n - i),
                key="k",
                source="destination",
            )
        )
    for j in range(data.draw(st.integers(1, 3), label="verifications")):
        seq = 2 * data.draw(st.integers(base // 2, base // 2 + n + 1), label="seq") + 1  # no tie
        events.append(
            ev(f"v{j}", "outcome_verified", WF, 2, "ck", seq=seq, key="k", source="verifier")
        )
    d, _ = audit(events)
    assert_matches(events, d)


def test_occurrences_past_the_frontiers_bound_are_flagged() -> None:
    """More out-of-order occurrences of one key than a frontier keeps: merged, harder to
    verify, and the finding says so."""
    events = takeover("effect_attempted", "k")
    n = 1100
    for i in range(n):
        events.append(ev(f"c{i}", "effect_attempted", WF, 1, "w1", seq=10 + n - i, key="k"))
    d, _ = audit(events)
    (f,) = d.findings()
    assert f.evidence_truncated and f.confidence != "high"
    assert_matches(events, d, capped=True)


# ---- late acquisitions, and every cap lowered --------------------------------------------------


@LONG
@given(SEEDS, st.sampled_from([("all", "seq"), ("mixed", "acyclic")]))
def test_acquisitions_arriving_after_everything_they_displace(
    seed: int, mode: tuple[str, str]
) -> None:
    """The workers' file, then the coordinator's (`cat workers coordinator | audit -`): with
    seq the findings are the oracle's; at lowered caps nothing is invented and what differs is
    flagged."""
    _, arrived = long_history(seed, *mode)
    rows = [r for r in arrived if r.kind != "lease_acquired"]
    rows += [r for r in arrived if r.kind == "lease_acquired"]
    events = build(rows)
    d, _ = audit(events)
    if mode[0] == "all":
        assert_matches(events, d)
    d, _ = audit(events, Config(max_evidence=8, max_acquisitions=2, max_event_ids=8))
    assert_matches(events, d, capped=True)


LOWERED = st.sampled_from(
    [
        Config(max_evidence=1),
        Config(max_evidence=8),
        Config(max_acquisitions=1),
        Config(max_acquisitions=3),
        Config(max_effect_keys=1),
        Config(max_effect_keys=4),
        Config(max_event_ids=1),
        Config(max_event_ids=16),
    ]
)


@LONG
@given(
    SEEDS, st.sampled_from([("all", "seq"), ("mixed", "acyclic"), ("none", "in_order")]), LOWERED
)
def test_each_cap_lowered_alone_is_exact_or_flagged(
    seed: int, mode: tuple[str, str], config: Config
) -> None:
    _, arrived = long_history(seed, *mode)
    events = build(arrived)
    d, _ = audit(events, config)
    assert_matches(events, d, capped=True)


# ---- the byte cap --------------------------------------------------------------------------------


def test_every_revision_stays_under_64_kib_and_says_what_it_cut() -> None:
    """Dozens of longest keys (512 characters that JSON escapes six-fold), longest ids, worker
    ids and workflow key: every revision fits, and one whose values were cut says so."""
    wf = "w" * 512
    big = "\u0001" * 500

    def e(n: int, kind: str, epoch: int, **kw: object) -> OwnershipEvent:
        worker = f"{epoch}".rjust(256, "x")
        return ev(f"{n}".rjust(128, "0"), kind, wf, epoch, worker, seq=n, **kw)  # type: ignore[arg-type]

    events = [e(1, "lease_acquired", 1), e(2, "lease_acquired", 2)]
    for i in range(60):
        key = f"{big}{i:012d}"
        events += [
            e(3 + 3 * i, "effect_attempted", 1, key=key),
            e(4 + 3 * i, "effect_committed", 1, key=key, source="destination"),
            e(5 + 3 * i, "effect_committed", 2, key=key, source="destination"),
        ]
    d, updates = audit(events)
    assert updates
    for u in updates:
        body = u.finding.to_json().encode()
        assert len(body) < 64 * 1024
        cut = any(k.endswith("…") for k in u.finding.effect_keys)
        if cut:
            assert u.finding.evidence_truncated and u.finding.confidence != "high"
    (f,) = d.findings()
    assert f.effect_keys_omitted + len(f.effect_keys) == 60
    assert f.severity.value == "critical"
