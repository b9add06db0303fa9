"""One small named history per rule sentence of DESIGN §3-§5, written from the text (and from
issue 8's examples and variants of them), not from the engine.

Unless a test says otherwise a history runs as `audit` does: `observe(event)` with no caller
time, then `finish()`, under `Config.for_audit()`. Worker-mode tests pass `at=` and call
`advance(now)`. Epochs 17 (alpha) and 18 (beta) are the usual displaced and current owners.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import pytest

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding
from detector.core import Config, Detector, FindingUpdate
from detector.core._rules import FENCE_POINTS

from .histories import BASE_TS, Run, ev
from .oracle import oracle

if TYPE_CHECKING:
    from _typeshed import TraceFunction

W = "wf"
K = "release-index/2026-07-26"
Y2099 = datetime(2099, 1, 1, tzinfo=UTC).timestamp() - BASE_TS  # seconds after BASE
MAX_FINDING_BYTES = 64 * 1024


# ---- builders ---------------------------------------------------------------------------------


def acq(eid: str, epoch: int, worker: str, seq: int | None = None, **kw: Any) -> OwnershipEvent:
    return ev(eid, "lease_acquired", kw.pop("wf", W), epoch, worker, seq=seq, **kw)


def act(
    eid: str, kind: str, epoch: int, worker: str, seq: int | None = None, **kw: Any
) -> OwnershipEvent:
    return ev(eid, kind, kw.pop("wf", W), epoch, worker, seq=seq, **kw)


def commit(
    eid: str, epoch: int, worker: str, seq: int | None = None, key: str = K, **kw: Any
) -> OwnershipEvent:
    kw.setdefault("source", "destination")
    return act(eid, "effect_committed", epoch, worker, seq, key=key, **kw)


def verify(eid: str, seq: int | None = None, key: str = K, **kw: Any) -> OwnershipEvent:
    return act(eid, "outcome_verified", 18, "checker", seq, key=key, source="verifier", **kw)


def takeover(seq: bool = True, **kw: Any) -> list[OwnershipEvent]:
    """alpha holds 17 (seq 1), beta acquires 18 (seq 5)."""
    return [
        acq("a17", 17, "alpha", 1 if seq else None, **kw),
        acq("a18", 18, "beta", 5 if seq else None, **kw),
    ]


# ---- running ----------------------------------------------------------------------------------


def audit(events: Sequence[OwnershipEvent], config: Config | None = None) -> Run:
    """`audit`: no caller time, then the end of the history."""
    r = Run(Detector(config=config or Config.for_audit())).feed(events)
    r.updates.extend(r.detector.finish())
    return r


def worker(events: Sequence[tuple[float, OwnershipEvent]], config: Config | None = None) -> Run:
    """A detector worker: each event with its processing time (seconds after BASE)."""
    r = Run(Detector(config=config or Config()))
    for at, e in events:
        r.updates.extend(r.detector.observe(e, at=BASE_TS + at))
    return r


def one(r: Run, wf: str = W) -> Finding:
    (f,) = r.findings(wf)
    return f


def kinds(f: Finding) -> list[tuple[str, str | None, int | None]]:
    """(kind, witness event id, witness seq), sorted."""
    return sorted((c.kind.value, c.event_id, c.seq) for c in f.conditions)


def status(f: Finding) -> str:
    return f.status.value


def same_findings(a: Run, b: Run) -> bool:
    return [f.model_dump() for f in a.findings()] == [f.model_dump() for f in b.findings()]


# ---- §3 identity: an event id already seen changes nothing ------------------------------------


def fenced_episode() -> list[OwnershipEvent]:
    """17 is seen once after the takeover, then says it lost: resolved (nothing to verify)."""
    return [
        *takeover(),
        act("h6", "heartbeat", 17, "alpha", 6),
        act("l7", "lease_lost", 17, "alpha", 7),
    ]


def test_a_seen_id_with_a_higher_seq_changes_nothing() -> None:
    """Issue 8 §5: the dedup check was skipped whenever seq > max_seq."""
    base = audit(fenced_episode())
    assert status(one(base)) == "resolved"
    again = audit([*fenced_episode(), act("h6", "heartbeat", 17, "alpha", 9)])
    assert again.updates == base.updates
    assert same_findings(again, base)


def test_a_seen_id_with_other_content_changes_nothing_and_is_counted() -> None:
    r = audit([*fenced_episode(), commit("a18", 17, "alpha", 20), commit("h6", 17, "alpha", 3)])
    assert same_findings(r, audit(fenced_episode()))
    assert r.detector.counters.id_conflicts == 2


@pytest.mark.parametrize("redelivered", ["hb3", "hb40"])
def test_a_redelivery_is_told_from_a_conflict_whether_its_event_was_forgotten_or_kept(
    redelivered: str,
) -> None:
    """An id's content is checked on a repeat whether its raw event is still kept (hb40) or was
    forgotten at the cap (hb3): the same content is a redelivery, other content a conflict."""
    config = Config(max_evidence=8)
    history = [acq("a1", 1, "alpha", 1)]
    history += [act(f"hb{s}", "heartbeat", 1, "alpha", s) for s in range(2, 41)]
    seq = int(redelivered[2:])
    for events, redelivered_count, conflicts in (
        ([act(redelivered, "heartbeat", 1, "alpha", seq)], 1, 0),
        ([act(redelivered, "heartbeat", 1, "beta", seq)], 0, 1),
        ([act(redelivered, "progress", 1, "alpha", seq)], 0, 1),
    ):
        r = worker([(0.0, e) for e in [*history, *events]], config)
        counters = r.detector.counters
        assert (counters.redelivered, counters.id_conflicts) == (redelivered_count, conflicts)
    kept = {e.event_id for e in r.detector.states[W].evidence}
    assert ("hb40" in kept, "hb3" in kept) == (True, False)


def test_a_repeated_acquisition_of_one_epoch_is_recognised_whichever_record_is_kept() -> None:
    """Two acquisitions of epoch 1: only the earlier is kept as a record. A redelivery of either
    is a redelivery, and other content under either id a conflict."""
    base = [acq("a1-late", 1, "alpha", 5)]
    base += [act(f"hb{s}", "heartbeat", 1, "alpha", s) for s in range(6, 16)]
    base.append(acq("a1-early", 1, "alpha", 2))  # replaces the kept record of epoch 1
    base.append(acq("a1-later", 1, "alpha", 20))  # not kept: 1 is held from seq 2
    for eid, seq in (("a1-late", 5), ("a1-early", 2), ("a1-later", 20)):
        same = worker([(0.0, e) for e in [*base, acq(eid, 1, "alpha", seq)]])
        other = worker([(0.0, e) for e in [*base, acq(eid, 1, "beta", seq)]])
        assert (same.detector.counters.redelivered, same.detector.counters.id_conflicts) == (1, 0)
        assert (other.detector.counters.redelivered, other.detector.counters.id_conflicts) == (
            0,
            1,
        )


def test_a_seen_id_cannot_become_an_acquisition() -> None:
    """The same id as an acquisition of a higher epoch: not a takeover, so nothing is stale."""
    r = audit(
        [
            acq("a1", 1, "w1", 1),
            act("h3", "heartbeat", 1, "w1", 3),
            acq("h3", 5, "w5", 2),  # a redelivery of h3's id
        ]
    )
    assert r.findings() == []


# ---- §4 staleness and arrival -----------------------------------------------------------------


def test_lower_epoch_evidence_after_the_takeover_is_stale() -> None:
    r = audit([*takeover(), act("p6", "progress", 17, "alpha", 6)])
    f = one(r)
    assert kinds(f) == [("stale_activity", "p6", 6)]
    assert (f.severity.value, f.displaced and f.displaced.owner_epoch) == ("info", 17)


def test_pre_takeover_evidence_arriving_late_raises_nothing() -> None:
    """Buffered or retried delivery: seq puts it before the takeover."""
    r = audit(
        [
            *takeover(),
            act("p3", "progress", 17, "alpha", 3),
            act("x4", "effect_attempted", 17, "alpha", 4, key=K),
            commit("c4", 17, "alpha", 4),
        ]
    )
    assert r.findings() == []


def test_an_acquisition_arriving_after_the_stale_events_still_finds_them() -> None:
    stale = [act("p6", "progress", 17, "alpha", 6), commit("c8", 17, "alpha", 8)]
    late = audit([acq("a17", 17, "alpha", 1), *stale, acq("a18", 18, "beta", 5)])
    in_order = audit([*takeover(), *stale])
    assert kinds(one(late)) == [("stale_activity", "p6", 6), ("stale_effect_committed", "c8", 8)]
    assert final(late) == final(in_order)


def final(r: Run) -> list[dict[str, Any]]:
    return [f.model_dump(exclude={"revision"}) for f in r.findings()]


def test_without_seq_arrival_decides_with_lower_confidence() -> None:
    r = audit([*takeover(seq=False), commit("c", 17, "alpha")])
    f = one(r)
    assert (f.ordering, f.severity.value) == ("arrival", "critical")
    assert f.confidence == "medium"  # a destination confirms, the order is only arrival


@pytest.mark.parametrize("heartbeat_first", [True, False])
def test_one_side_without_seq_is_ordered_by_arrival(heartbeat_first: bool) -> None:
    """§4: when one of two events carries seq and the other does not, arrival decides."""
    hb = act("h", "heartbeat", 17, "alpha")  # no seq
    events = [acq("a17", 17, "alpha", 1)]
    events += (
        [hb, acq("a18", 18, "beta", 5)] if heartbeat_first else [acq("a18", 18, "beta", 5), hb]
    )
    r = audit(events)
    assert (r.findings() == []) is heartbeat_first


@pytest.mark.parametrize(("fence_first", "expected"), [(False, "resolved"), (True, "open")])
def test_a_fence_is_compared_with_a_stale_event_without_seq_by_arrival(
    fence_first: bool, expected: str
) -> None:
    """Issue 8 §5: order_key put every no-seq event after every seq event, giving a wrong
    `resolved`. The heartbeat has no seq: it is before the lease_lost iff it arrived first."""
    hb = act("h", "heartbeat", 17, "alpha")
    lost = act("l6", "lease_lost", 17, "alpha", 6)
    r = audit([*takeover(), *([lost, hb] if fence_first else [hb, lost])])
    f = one(r)
    assert status(f) == expected
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "h"


def test_witness_and_last_stale_event_agree_with_the_pairwise_rule() -> None:
    """The no-seq heartbeat arrived before the seq-9 one: it is the earliest (the witness)
    and the seq-9 one the latest (the last stale event)."""
    r = audit(
        [*takeover(), act("h", "heartbeat", 17, "alpha"), act("h9", "heartbeat", 17, "alpha", 9)]
    )
    f = one(r)
    assert kinds(f) == [("stale_activity", "h", None)]
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "h9"


# ---- §4 transition and lag --------------------------------------------------------------------

OUT_OF_EPOCH_ORDER = [
    acq("a1", 1, "w1", 1),
    acq("a3", 3, "w3", 2),
    act("h5", "heartbeat", 1, "w1", 5),
    acq("a2", 2, "w2", 10),
]


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(4))))
def test_the_transition_is_the_acquisition_that_displaced_the_event(
    arrival: tuple[int, ...],
) -> None:
    """Issue 8 §5: epoch 3 at seq 2, epoch 1 stale at seq 5, epoch 2 acquired at seq 10 printed
    "lost epoch 1 ... at seq 10" with a lag of -5. Any arrival order."""
    r = audit([OUT_OF_EPOCH_ORDER[i] for i in arrival])
    f = one(r)
    assert f.transition is not None and (f.transition.event_id, f.transition.seq) == ("a3", 2)
    assert f.evidence_lag is not None and f.evidence_lag.seq == 3
    assert f.current is not None and (f.current.worker_id, f.current.owner_epoch) == ("w3", 3)
    assert "seq 10" not in f.response


def test_the_transition_with_mixed_seq_is_the_earliest_displacing_acquisition() -> None:
    """Acquisitions of 1 and 2 without seq arrived before the stale heartbeat (no seq), and so
    did 3's (seq 4): pairwise, 1's acquisition is the earliest of them."""
    r = audit(
        [
            acq("a0", 0, "w0"),
            acq("a1", 1, "w1"),
            acq("a2", 2, "w2"),
            acq("a3", 3, "w3", 4),
            act("h", "heartbeat", 0, "w0"),
        ]
    )
    f = one(r)
    assert f.transition is not None and f.transition.event_id == "a1"
    assert f.current is not None and f.current.owner_epoch == 3


def test_evidence_lag_seconds_is_null_when_clocks_would_make_it_negative() -> None:
    r = audit(
        [
            acq("a17", 17, "alpha", 1, t=0),
            acq("a18", 18, "beta", 5, t=100),
            act("p6", "progress", 17, "alpha", 6, t=50),  # alpha's clock is behind
        ]
    )
    lag = one(r).evidence_lag
    assert lag is not None and (lag.seq, lag.seconds) == (1, None)


# ---- §4 activity with an effect key -----------------------------------------------------------


def test_activity_with_an_effect_key_is_one_condition_and_no_affected_key() -> None:
    """Issue 8 §5: heartbeats/progress with an effect_key became one condition per key and
    blocked resolution until those keys were verified."""
    r = audit(
        [
            *takeover(),
            act("h6", "heartbeat", 17, "alpha", 6, key="A"),
            act("p7", "progress", 17, "alpha", 7, key="B"),
            act("h8", "heartbeat", 17, "alpha", 8, key="A"),
            act("l9", "lease_lost", 17, "alpha", 9),
        ]
    )
    f = one(r)
    assert kinds(f) == [("stale_activity", "h6", 6)]
    assert f.effect_keys == []
    assert (status(f), f.severity.value, f.confidence) == ("resolved", "info", "high")


# ---- §4 handoffs ------------------------------------------------------------------------------


def clean_handoffs(n: int) -> list[OwnershipEvent]:
    """n owners in turn, each committing its own key and releasing before the next acquires."""
    out: list[OwnershipEvent] = []
    seq = 0
    for epoch in range(1, n + 1):
        for e in (
            acq(f"a{epoch}", epoch, f"w{epoch}", seq + 1),
            act(f"h{epoch}", "heartbeat", epoch, f"w{epoch}", seq + 2),
            commit(f"c{epoch}", epoch, f"w{epoch}", seq + 3, key=f"k{epoch}"),
            act(f"r{epoch}", "lease_released", epoch, f"w{epoch}", seq + 4),
        ):
            out.append(e)
        seq += 4
    return out


@pytest.mark.parametrize("config", [Config.for_audit(), Config()], ids=["audit", "worker"])
def test_handoffs_are_not_incidents_however_many(config: Config) -> None:
    """Acquisition counts are not errors, not even past the worker's acquisition cap."""
    r = audit(clean_handoffs(20), config)
    assert r.findings() == []
    assert r.detector.counters.findings_opened == 0


# ---- §4 conditions table ----------------------------------------------------------------------

CONDITIONS = [
    # kind of the stale event, source, condition, severity, a word of the operator response,
    # confidence (seq throughout; an attempt has no destination confirmation)
    ("heartbeat", "worker", "stale_activity", "info", "quarantine", "high"),
    ("progress", "worker", "stale_activity", "info", "quarantine", "high"),
    ("effect_rejected", "destination", "stale_effect_rejected", "warning", "receipt", "high"),
    ("effect_attempted", "worker", "stale_effect_attempt", "warning", "freeze", "medium"),
    (
        "effect_committed",
        "destination",
        "stale_effect_committed",
        "critical",
        "compensation",
        "high",
    ),
]


@pytest.mark.parametrize(
    ("kind", "source", "condition", "severity", "word", "confidence"), CONDITIONS
)
def test_each_condition_alone(
    kind: str, source: str, condition: str, severity: str, word: str, confidence: str
) -> None:
    key = None if condition == "stale_activity" else K
    r = audit([*takeover(), act("s6", kind, 17, "alpha", 6, key=key, source=source)])
    f = one(r)
    assert kinds(f) == [(condition, "s6", 6)]
    assert f.severity.value == severity
    assert word in f.response.lower()
    assert f.confidence == confidence
    assert (f.displaced and f.displaced.worker_id, f.current and f.current.worker_id) == (
        "alpha",
        "beta",
    )


@pytest.mark.parametrize("kind", ["lease_lost", "ownership_uncertain", "lease_released"])
def test_knowing_it_lost_is_not_a_condition(kind: str) -> None:
    assert audit([*takeover(), act("x6", kind, 17, "alpha", 6)]).findings() == []


def test_a_verifiers_outcome_is_never_stale() -> None:
    r = audit(
        [*takeover(), act("v6", "outcome_verified", 17, "checker", 6, key=K, source="verifier")]
    )
    assert r.findings() == []


def test_failover_duplicate_after_a_clean_handoff() -> None:
    """The new owner redid what the old one committed before the takeover: the idempotency
    boundary failed. The lower epoch's finding, fenced by the handoff: it resolves once the
    key is verified."""
    history = [
        acq("a17", 17, "alpha", 1),
        commit("c2", 17, "alpha", 2),
        act("r3", "lease_released", 17, "alpha", 3),
        acq("a18", 18, "beta", 5),
        commit("c6", 18, "beta", 6),
    ]
    f = one(audit(history))
    assert [(c.kind.value, c.cause, c.event_id, c.epochs) for c in f.conditions] == [
        ("duplicate_effect", "failover", "c6", [17, 18])
    ]
    assert (f.severity.value, status(f), f.last_stale_event) == ("critical", "open", None)
    assert f.displaced is not None and f.displaced.owner_epoch == 17
    assert f.current is not None and f.current.owner_epoch == 18
    assert status(one(audit([*history, verify("v7", 7)]))) == "resolved"


def test_retry_duplicate_is_a_finding_of_its_own() -> None:
    r = audit(
        [
            acq("a18", 18, "beta", 1),
            commit("c2", 18, "beta", 2),
            commit("c3", 18, "beta", 3),  # the same key again, the same source, another id
        ]
    )
    f = one(r)
    assert f.displaced is None
    assert [(c.kind.value, c.cause, c.event_id, c.epochs) for c in f.conditions] == [
        ("duplicate_effect", "retry", "c3", [18])
    ]
    assert (f.severity.value, f.current and f.current.owner_epoch) == ("warning", 18)


def test_a_workers_claim_and_the_destinations_confirmation_are_one_commit() -> None:
    r = audit(
        [
            acq("a18", 18, "beta", 1),
            commit("c2", 18, "beta", 2, source="worker"),
            commit("c3", 18, "beta", 3),
        ]
    )
    assert r.findings() == []


def test_a_failover_duplicate_belongs_to_the_lower_epochs_finding() -> None:
    r = audit([*takeover(), commit("c6", 17, "alpha", 6), commit("c7", 18, "beta", 7)])
    f = one(r)
    assert f.displaced is not None and f.displaced.owner_epoch == 17
    assert kinds(f) == [
        ("duplicate_effect", "c7", 7),
        ("stale_effect_committed", "c6", 6),
    ]


# ---- §4 current -------------------------------------------------------------------------------


def test_current_is_the_highest_epoch_acquired_before_the_latest_condition() -> None:
    history = [
        acq("a1", 1, "w1", 1),
        acq("a2", 2, "w2", 2),
        act("h3", "heartbeat", 1, "w1", 3),
        acq("a3", 3, "w3", 4),
    ]
    f = one(audit(history))
    assert f.current is not None and f.current.owner_epoch == 2
    # another occurrence of the same condition is the latest condition now
    f = one(audit([*history, act("h5", "heartbeat", 1, "w1", 5)]))
    assert kinds(f) == [("stale_activity", "h3", 3)]
    assert f.current is not None and f.current.owner_epoch == 3


def test_a_repeated_duplicate_commit_is_the_latest_condition() -> None:
    """The third commit of a key (under the higher epoch) repeats the failover duplicate of
    the lower epoch's episode: `current` is what was acquired before it."""
    history = [
        acq("a1", 1, "w1", 1),
        commit("c2", 1, "w1", 2),
        acq("a2", 2, "w2", 3),
        commit("c4", 2, "w2", 4),
        acq("a3", 3, "w3", 5),
        commit("c6", 2, "w2", 6, source="worker"),  # epoch 2 again (a worker's claim)
    ]
    f = audit(history).finding(W, 1)
    assert [(c.kind.value, c.event_id) for c in f.conditions] == [("duplicate_effect", "c4")]
    assert f.current is not None and f.current.owner_epoch == 3


# ---- §4 opening, escalating, resolving ----------------------------------------------------------


def test_a_finding_opens_at_the_first_condition_and_only_escalates() -> None:
    r = audit(
        [
            *takeover(),
            act("h6", "heartbeat", 17, "alpha", 6),
            act("x7", "effect_attempted", 17, "alpha", 7, key=K),
            commit("c8", 17, "alpha", 8),
            act("h9", "heartbeat", 17, "alpha", 9),
            act("l10", "lease_lost", 17, "alpha", 10),
            verify("v11", 11),
        ]
    )
    revs = [u.finding for u in r.updates]
    assert len({f.finding_id for f in revs}) == 1
    assert [f.revision for f in revs] == list(range(1, len(revs) + 1))
    assert [f.severity.value for f in revs][:3] == ["info", "warning", "critical"]
    assert all(f.severity.value == "critical" for f in revs[2:])
    assert status(revs[-1]) == "resolved"


FENCES = [
    # what 17 says or receives after its last stale event, and whether it fences
    ("lease_lost", "worker", True),
    ("lease_released", "worker", True),
    ("ownership_uncertain", "worker", False),
    ("effect_rejected", "destination", True),
    ("effect_rejected", "worker", False),  # a worker relaying a rejection is no receipt
]


@pytest.mark.parametrize(("kind", "source", "fences"), FENCES)
def test_what_counts_as_known_fenced(kind: str, source: str, fences: bool) -> None:
    key = "other" if kind == "effect_rejected" else None
    history = [
        *takeover(),
        act("h6", "heartbeat", 17, "alpha", 6),
        act("f7", kind, 17, "alpha", 7, key=key, source=source),
    ]
    if key:
        history.append(verify("v8", 8, key=key))
    assert status(one(audit(history))) == ("resolved" if fences else "open")


def test_a_destinations_rejection_that_is_the_last_stale_event_fences() -> None:
    history = [
        *takeover(),
        act("j6", "effect_rejected", 17, "alpha", 6, key=K, source="destination"),
    ]
    assert status(one(audit(history))) == "open"  # fenced, but the key is not verified yet
    assert status(one(audit([*history, verify("v7", 7)]))) == "resolved"


def test_a_fence_before_the_last_stale_event_does_not_count() -> None:
    r = audit(
        [
            *takeover(),
            act("h6", "heartbeat", 17, "alpha", 6),
            act("l7", "lease_lost", 17, "alpha", 7),
            act("h8", "heartbeat", 17, "alpha", 8),
        ]
    )
    assert status(one(r)) == "open"


def test_resolution_needs_both_the_fence_and_the_verification() -> None:
    stale = [*takeover(), commit("c6", 17, "alpha", 6)]
    lost = act("l7", "lease_lost", 17, "alpha", 7)
    assert status(one(audit([*stale, lost]))) == "open"
    assert status(one(audit([*stale, verify("v8", 8)]))) == "open"
    assert status(one(audit([*stale, lost, verify("v8", 8)]))) == "resolved"
    # a worker's "verified" is no verifier's
    claim = act("v8", "outcome_verified", 18, "beta", 8, key=K)
    assert status(one(audit([*stale, lost, claim]))) == "open"
    # a verification before the commit verifies nothing
    assert status(one(audit([*stale, lost, verify("v5", 5, key=K)]))) == "open"


def test_a_third_commit_after_verification_reopens() -> None:
    history = [
        acq("a17", 17, "alpha", 1),
        commit("c2", 17, "alpha", 2),
        acq("a18", 18, "beta", 5),
        commit("c6", 18, "beta", 6),
        verify("v7", 7),
    ]
    assert status(audit(history).finding(W, 17)) == "resolved"
    again = audit([*history, commit("c8", 18, "beta", 8)])
    assert status(again.finding(W, 17)) == "open"


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(4))))
def test_a_third_commit_after_verification_reopens_in_any_arrival_order(
    arrival: tuple[int, ...],
) -> None:
    """With seq on every event the verdict does not depend on arrival: the commit at seq 8
    repeats the failover duplicate after its verification (seq 7)."""
    effects = [
        commit("c2", 17, "alpha", 2),
        commit("c6", 18, "beta", 6),
        verify("v7", 7),
        commit("c8", 18, "beta", 8),
    ]
    r = audit([*takeover(), *(effects[i] for i in arrival)])
    assert status(r.finding(W, 17)) == "open"


# ---- §4 confidence ------------------------------------------------------------------------------

CONFIDENCE = [
    # seq?, source of the stale commit, confidence
    (True, "destination", "high"),
    (True, "worker", "medium"),
    (False, "destination", "medium"),
    (False, "worker", "low"),
]


@pytest.mark.parametrize(("seq", "source", "confidence"), CONFIDENCE)
def test_confidence(seq: bool, source: str, confidence: str) -> None:
    stale = commit("c6", 17, "alpha", 6 if seq else None, source=source)
    assert one(audit([*takeover(seq=seq), stale])).confidence == confidence


def test_a_finding_with_only_activity_needs_only_authoritative_order_for_high() -> None:
    """Issue 8 §9: a finding with no effect condition is high when its order is seq."""
    assert one(audit([*takeover(), act("h6", "heartbeat", 17, "alpha", 6)])).confidence == "high"


def test_an_unconfirmed_attempt_is_not_high() -> None:
    f = one(audit([*takeover(), act("x6", "effect_attempted", 17, "alpha", 6, key=K)]))
    assert f.confidence == "medium"


# ---- §4 time and silence -------------------------------------------------------------------------


def stale_then(*later: OwnershipEvent, wf: str = W) -> list[OwnershipEvent]:
    """17 heartbeats once after the takeover (t=20): nothing to verify, no fence."""
    return [
        acq("a17", 17, "alpha", 1, t=0, wf=wf),
        acq("a18", 18, "beta", 5, t=10, wf=wf),
        act("h6", "heartbeat", 17, "alpha", 6, t=20, wf=wf),
        *later,
    ]


def test_silence_is_observed_never_assumed() -> None:
    """A workflow with no later events is not quiet in audit."""
    assert status(one(audit(stale_then()))) == "open"


def test_audit_measures_the_quiet_period_on_the_workflows_own_times() -> None:
    """Quiet when the latest believed time is at least 600 s after the last stale event's."""
    at_600 = audit(stale_then(act("h7", "heartbeat", 18, "beta", 7, t=620)))
    at_599 = audit(stale_then(act("h7", "heartbeat", 18, "beta", 7, t=619)))
    assert (status(one(at_600)), status(one(at_599))) == ("resolved", "open")


def test_another_workflows_clock_never_moves_the_quiet_period() -> None:
    """Issue 8 §3: one unrelated event with observed_at in 2099 resolved every finding. Here
    the other workflow's emitters even agree with each other, so it is believed there."""
    other = [
        acq("o1", 1, "wx", 1, t=Y2099, wf="other"),
        act("o2", "heartbeat", 1, "wx", 2, t=Y2099 + 1, wf="other"),
        acq("o3", 2, "wy", 3, t=Y2099 + 2, wf="other"),
    ]
    r = audit([*stale_then(), *other])
    assert status(one(r)) == "open"
    assert r.findings("other") == []


def test_a_single_far_future_time_of_the_same_worker_is_not_believed() -> None:
    r = audit(stale_then(act("h7", "heartbeat", 18, "beta", 7, t=Y2099)))
    assert status(one(r)) == "open"
    assert r.detector.counters.times_disbelieved == 1


def test_a_far_future_time_is_believed_once_another_source_reports_one_near_it() -> None:
    """A real ten-day silence: beta's clock is confirmed by the coordinator's."""
    ten_days = 10 * 24 * 3600.0
    r = audit(
        stale_then(
            act("h7", "heartbeat", 18, "beta", 7, t=ten_days),
            act("h8", "heartbeat", 18, "beta", 8, t=ten_days + 5, source="coordinator"),
        )
    )
    assert status(one(r)) == "resolved"


def test_a_far_future_time_of_the_same_worker_and_source_stays_disbelieved() -> None:
    ten_days = 10 * 24 * 3600.0
    r = audit(
        stale_then(
            act("h7", "heartbeat", 18, "beta", 7, t=ten_days),
            act("h8", "heartbeat", 18, "beta", 8, t=ten_days + 5),
        )
    )
    assert status(one(r)) == "open"


def test_a_believed_time_within_the_bound_vouches_for_a_far_one() -> None:
    """beta's 6700 is beyond the bound of the latest believed time (3000) when it comes, but
    the coordinator then reports 3200, within the bound of it: 6700 is believed, and alpha's
    last stale time (3000) is 3700 s behind it."""
    r = audit(
        [
            acq("a17", 17, "alpha", 1, t=0),
            acq("a18", 18, "beta", 2, t=10),
            act("h3", "heartbeat", 17, "alpha", 3, t=3000),
            act("h4", "heartbeat", 18, "beta", 4, t=6700),
            act("x5", "heartbeat", 18, "beta", 5, t=3200, source="coordinator"),
        ]
    )
    assert status(one(r)) == "resolved"


def test_silence_in_a_mixed_workflow_follows_the_pairwise_order() -> None:
    """alpha's stale heartbeat has no seq and arrived before beta's seq-6 heartbeat: it is
    before it, so beta's time 700 s later is silence after it."""
    r = audit(
        [
            acq("a17", 17, "alpha", 1, t=0),
            acq("a18", 18, "beta", 5, t=10),
            act("h", "heartbeat", 17, "alpha", t=1000),
            act("h6", "heartbeat", 18, "beta", 6, t=1700),
        ]
    )
    assert status(one(r)) == "resolved"


def test_a_worker_measures_silence_on_its_own_clock() -> None:
    """Every emitter claims 2099; only the caller's processing time counts."""
    events = [
        (0.0, acq("a17", 17, "alpha", 1, t=Y2099)),
        (1.0, acq("a18", 18, "beta", 5, t=Y2099)),
        (2.0, act("h6", "heartbeat", 17, "alpha", 6, t=Y2099)),
        (3.0, act("h7", "heartbeat", 18, "beta", 7, t=Y2099 + 10_000)),
    ]
    r = worker(events)
    r.advance(BASE_TS + 2.0 + 599)
    assert status(one(r)) == "open"
    r.advance(BASE_TS + 2.0 + 600)
    assert status(one(r)) == "resolved"


def test_a_worker_never_lets_another_workflows_clock_resolve() -> None:
    events = [
        (0.0, acq("a17", 17, "alpha", 1, t=0)),
        (1.0, acq("a18", 18, "beta", 5, t=1)),
        (2.0, act("h6", "heartbeat", 17, "alpha", 6, t=2)),
        (3.0, acq("o1", 1, "wx", 1, t=Y2099, wf="other")),
    ]
    r = worker(events)
    r.advance(BASE_TS + 100)
    assert status(one(r)) == "open"


FIVE = [
    acq("a17", 17, "alpha", 1, t=0),
    acq("a18", 18, "beta", 2, t=10),
    act("h3", "heartbeat", 17, "alpha", 3, t=20),
    act("h4", "heartbeat", 18, "beta", 4, t=700),
    act("h5", "heartbeat", 18, "beta", 5, t=705),
]


def test_five_events_with_seq_give_one_status_in_every_arrival_order() -> None:
    """Issue 8 §3: the same five events gave resolved in one order and open in another."""
    statuses = {
        tuple(status(f) for f in audit(list(p)).findings()) for p in itertools.permutations(FIVE)
    }
    assert statuses == {("resolved",)}


# ---- §4 retention ---------------------------------------------------------------------------

CONFIGS = pytest.mark.parametrize(
    "config", [Config.for_audit(), Config()], ids=["audit-caps", "worker-caps"]
)


@CONFIGS
def test_the_first_commit_outlives_forty_other_effects(config: Config) -> None:
    """Issue 8 §1: commit K, then 40 other effects, then the next owner commits K: no finding."""
    history = [acq("a17", 17, "alpha", 1), commit("c2", 17, "alpha", 2)]
    history += [commit(f"o{i}", 17, "alpha", 3 + i, key=f"other-{i}") for i in range(40)]
    history += [acq("a18", 18, "beta", 50), commit("c51", 18, "beta", 51)]
    f = audit(history, config).finding(W, 17)
    assert [(c.kind.value, c.cause, c.event_id) for c in f.conditions] == [
        ("duplicate_effect", "failover", "c51")
    ]
    assert not f.evidence_truncated


@CONFIGS
def test_a_fence_outlives_forty_heartbeats_of_the_new_owner(config: Config) -> None:
    history = [
        *takeover(),
        act("h6", "heartbeat", 17, "alpha", 6),
        act("l7", "lease_lost", 17, "alpha", 7),
    ]
    history += [act(f"b{i}", "heartbeat", 18, "beta", 8 + i) for i in range(40)]
    f = one(audit(history, config))
    assert status(f) == "resolved"
    assert not f.evidence_truncated


@CONFIGS
def test_a_late_acquisition_after_many_events_still_finds_the_stale_commit(config: Config) -> None:
    history = [acq("a17", 17, "alpha", 1), commit("c6", 17, "alpha", 6)]
    history += [act(f"h{i}", "heartbeat", 17, "alpha", 7 + i) for i in range(40)]
    history.append(acq("a18", 18, "beta", 5))
    f = one(audit(history, config))
    assert f.severity.value == "critical"
    witnesses = {c.kind.value: c.event_id for c in f.conditions}
    assert witnesses["stale_effect_committed"] == "c6"
    if witnesses.get("stale_activity") != "h0":  # the heartbeats are routine: they may go
        assert f.evidence_truncated
    if config.max_evidence > 1000:
        assert witnesses == {"stale_effect_committed": "c6", "stale_activity": "h0"}


@CONFIGS
def test_a_finding_that_lost_evidence_to_a_cap_says_so(config: Config) -> None:
    """The finding of 2 exists (a failover duplicate) when the acquisition of 3 arrives late
    and makes 2's progress and forty heartbeats stale; the earliest of them is the witness,
    or the finding says its evidence was cut."""
    history = [acq("a2", 2, "w2", 1), commit("c2", 2, "w2", 2), act("p20", "progress", 2, "w2", 20)]
    history += [act(f"h{i}", "heartbeat", 2, "w2", 21 + i) for i in range(40)]
    history += [commit("c61", 3, "w3", 61), acq("a3", 3, "w3", 10)]
    f = one(audit(history, config))
    exact = kinds(f) == [("duplicate_effect", "c61", 61), ("stale_activity", "p20", 20)]
    assert exact or f.evidence_truncated
    assert exact or config.max_evidence < 1000


@CONFIGS
def test_a_stale_event_after_eighteen_acquisitions(config: Config) -> None:
    history = [acq(f"a{e}", e, f"w{e}", e) for e in range(1, 19)]
    history.append(act("h19", "heartbeat", 1, "w1", 19))
    f = audit(history, config).finding(W, 1)
    assert kinds(f) == [("stale_activity", "h19", 19)]
    exact = f.transition is not None and f.transition.event_id == "a2"
    exact = exact and f.current is not None and f.current.owner_epoch == 18
    assert exact or f.evidence_truncated
    if config.max_acquisitions > 1000:
        assert exact and not f.evidence_truncated


@CONFIGS
@pytest.mark.parametrize("seq", [True, False])
def test_a_redelivery_after_forty_events_raises_nothing(config: Config, seq: bool) -> None:
    """Issue 8 §1: a redelivery after 40 events raised a false stale_activity."""
    s = itertools.count(1) if seq else itertools.repeat(None)
    h = act("h", "heartbeat", 17, "alpha", next(s))
    history = [acq("a17", 17, "alpha", next(s)), h, acq("a18", 18, "beta", next(s))]
    history += [act(f"b{i}", "heartbeat", 18, "beta", next(s)) for i in range(40)]
    r = audit([*history, h], config)
    assert r.findings() == []


@CONFIGS
def test_a_redelivery_after_forty_events_does_not_reopen(config: Config) -> None:
    h = act("h6", "heartbeat", 17, "alpha", 6)
    history = [*takeover(), h, act("l7", "lease_lost", 17, "alpha", 7)]
    history += [act(f"b{i}", "heartbeat", 18, "beta", 8 + i) for i in range(40)]
    r = audit([*history, h], config)
    assert status(one(r)) == "resolved"


@CONFIGS
def test_silence_outlives_the_caps(config: Config) -> None:
    """A verified stale attempt, forty heartbeats of the new owner, then ten quiet minutes:
    resolved by silence, or the finding says its evidence was cut."""
    history = [
        acq("a17", 17, "alpha", 1, t=0),
        acq("a18", 18, "beta", 2, t=1),
        act("x3", "effect_attempted", 17, "alpha", 3, key=K, t=10),
        verify("v4", 4, t=20),
    ]
    history += [act(f"b{i}", "heartbeat", 18, "beta", 5 + i, t=30 + i) for i in range(40)]
    history.append(act("b-late", "heartbeat", 18, "beta", 100, t=30 + 40 + 700))
    f = one(audit(history, config))
    assert status(f) == "resolved" or f.evidence_truncated


def test_thousands_of_events_per_workflow_are_exact_with_audit_caps() -> None:
    history = [acq("a17", 17, "alpha", 1), commit("c2", 17, "alpha", 2)]
    seq = itertools.count(3)
    for i in range(3000):
        history.append(act(f"h{i}", "heartbeat", 17, "alpha", next(seq)))
        if i % 10 == 0:
            history.append(commit(f"o{i}", 17, "alpha", next(seq), key=f"other-{i}"))
    dup, late = commit("c-dup", 18, "beta", 4000), act("p-late", "progress", 17, "alpha", 4001)
    history += [acq("a18", 18, "beta", 3999), dup, late]
    r = audit(history)
    f = r.finding(W, 17)
    assert kinds(f) == [("duplicate_effect", "c-dup", 4000), ("stale_activity", "p-late", 4001)]
    assert not f.evidence_truncated
    assert r.detector.truncated_workflows() == []
    assert f.current is not None and f.current.owner_epoch == 18


def test_a_truncated_finding_says_so_and_is_never_high() -> None:
    """Tiny caps: whatever survives, nothing is invented, a cut is named, never `high`."""
    tiny = Config(max_evidence=2, max_acquisitions=1, max_effect_keys=2, max_event_ids=2)
    history = [acq("a17", 17, "alpha", 1)]
    history += [commit(f"c{i}", 17, "alpha", 2 + i, key=f"k{i}") for i in range(10)]
    history += [acq("a18", 18, "beta", 20)]
    history += [commit(f"d{i}", 18, "beta", 21 + i, key=f"k{i}") for i in range(10)]
    history += [act("h40", "heartbeat", 17, "alpha", 40)]
    r = audit(history, tiny)
    expected = oracle(history)[(W, "displaced", 17)]
    assert W in r.detector.truncated_workflows()
    for f in r.findings():
        assert {(c.kind.value, c.cause, c.effect_key) for c in f.conditions} <= expected.conditions
        if f.evidence_truncated:
            assert f.confidence != "high"
    for f in r.findings(W):
        listed = len(f.conditions) + f.conditions_omitted
        if f.displaced and f.displaced.owner_epoch == 17 and listed != len(expected.conditions):
            assert f.evidence_truncated


# ---- §4 work per event, bounded findings --------------------------------------------------------


def zombie(n: int) -> list[OwnershipEvent]:
    """Two acquisitions, then a displaced owner attempting n distinct effect keys."""
    return [
        acq("a1", 1, "w1", 1, t=0),
        acq("a2", 2, "w2", 2, t=1),
        *(
            act(f"z{i}", "effect_attempted", 1, "w1", 3 + i, key=f"key-{i:06d}", t=2 + i)
            for i in range(n)
        ),
    ]


def lines_run(work: Callable[[], object]) -> int:
    """The lines of Python that `work` ran (a loop's line once per pass, comprehensions too): its
    cost, counted the same on an idle machine and a loaded one."""
    count = 0

    def tracer(
        frame: FrameType,
        event: Literal["call", "line", "return", "exception", "opcode"],
        arg: object,
    ) -> TraceFunction:
        nonlocal count
        count += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


@CONFIGS
def test_a_zombie_with_thousands_of_keys_is_cheap_and_its_finding_small(config: Config) -> None:
    """Issue 8 §2: N stale attempts with distinct keys took cubic time (N=3000 did not end in
    15 minutes) and one finding became 123 KB."""
    n = 4000
    events = zombie(n)
    d = Detector(config=config)
    updates: list[FindingUpdate] = []

    def observed(chunk: list[OwnershipEvent]) -> Callable[[], None]:
        return lambda: updates.extend(u for e in chunk for u in d.observe(e))

    first_k = lines_run(observed(events[:1002]))
    observed(events[1002 : n - 998])()
    last_k = lines_run(observed(events[n - 998 :]))
    updates.extend(d.finish())
    # flat: the last thousand keys cost what the first thousand did (within 2%); an event that
    # walked the keys already seen, even at a quarter of a line per key, would cost 10% more
    assert last_k < 1.1 * first_k, (first_k, last_k)
    assert max(len(u.finding.to_json().encode()) for u in updates) < MAX_FINDING_BYTES
    f = one(Run(d))
    assert len(f.to_json().encode()) < MAX_FINDING_BYTES
    assert len(f.conditions) <= 25 and len(f.effect_keys) <= 25
    if not f.evidence_truncated:
        assert len(f.conditions) + f.conditions_omitted == n
    assert len(f.effect_keys) + f.effect_keys_omitted == n or f.evidence_truncated
    assert f.severity.value == "warning"


def test_nothing_omitted_means_zero() -> None:
    f = one(audit([*takeover(), commit("c6", 17, "alpha", 6)]))
    assert (f.conditions_omitted, f.effect_keys_omitted, f.evidence_truncated) == (0, 0, False)


# ---- §5 words an operator acts on ---------------------------------------------------------------


def test_a_duplicates_response_names_its_own_commits_owners() -> None:
    """Issue 8 §6: "committed under two owners (w28 (epoch 9) and w16 (epoch 13))" when the
    commits were under 9 and 11."""
    r = audit(
        [
            acq("a9", 9, "wA", 1),
            commit("c2", 9, "wA", 2),
            acq("a11", 11, "wB", 3),
            commit("c4", 11, "wB", 4),
            acq("a13", 13, "wC", 5),
            act("h6", "heartbeat", 9, "wA", 6),  # the latest condition: current is 13 now
        ]
    )
    f = r.finding(W, 9)
    assert f.current is not None and f.current.owner_epoch == 13
    assert "wA (epoch 9)" in f.response and "wB (epoch 11)" in f.response


def test_a_duplicate_under_a_never_acquired_epoch_names_both_owners() -> None:
    """Issue 8 §6: it read "(w1 (epoch 1) and w1 (epoch 1))"."""
    r = audit([acq("a1", 1, "w1", 1), commit("c2", 1, "w1", 2), commit("c3", 2, "w2", 3)])
    f = r.finding(W, 1)
    assert "w1 (epoch 1)" in f.response and "w2 (epoch 2)" in f.response
    assert "w1 (epoch 1) and w1 (epoch 1)" not in f.response


def test_config_for_audit_exists_and_raises_the_caps() -> None:
    audit_caps, worker_caps = Config.for_audit(), Config()
    for cap in ("max_evidence", "max_acquisitions", "max_effect_keys", "max_event_ids"):
        assert getattr(audit_caps, cap) >= 10 * getattr(worker_caps, cap), cap
    assert (worker_caps.quiet_period_s, worker_caps.clock_skew_s) == (600.0, 3600.0)


# ---- §4 two events at one seq: an acquisition first, then event_id ---------------------------

TIED_KINDS = ["heartbeat", "progress", "effect_attempted", "effect_committed", "effect_rejected"]


@pytest.mark.parametrize("kind", TIED_KINDS)
@pytest.mark.parametrize("first", [True, False])
def test_an_event_at_the_takeovers_own_seq_is_stale_whichever_arrives_first(
    kind: str, first: bool
) -> None:
    """A lower epoch's event at the takeover's own seq is stale, in both arrival orders."""
    stale = act("x5", kind, 17, "alpha", 5, key=None if kind in ("heartbeat", "progress") else K)
    events = [acq("a17", 17, "alpha", 1), *([stale] if first else []), acq("a18", 18, "beta", 5)]
    f = one(audit(events if first else [*events, stale]))
    assert f.transition is not None and f.transition.event_id == "a18"
    assert f.current is not None and f.current.owner_epoch == 18
    assert f.evidence_lag is not None and f.evidence_lag.seq == 0
    assert f.ordering == "authoritative_seq"


TIE_CURRENT = [
    acq("a2", 2, "w2", 1),
    acq("a3", 3, "w3", 7),
    commit("c7", 2, "w2", 7),
    act("h6", "heartbeat", 2, "w2", 6),
    acq("a1", 1, "w1", 0),
]


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(5))))
def test_current_and_transition_with_a_tie_do_not_depend_on_arrival(
    arrival: tuple[int, ...],
) -> None:
    """Epoch 3 acquired at seq 7 and 2's commit at seq 7: the acquisition is first, so the commit
    is stale, 3 is current and the transition; the heartbeat at 6 is not stale."""
    f = one(audit([TIE_CURRENT[i] for i in arrival]))
    assert f.current is not None and (f.current.worker_id, f.current.owner_epoch) == ("w3", 3)
    assert f.transition is not None and f.transition.event_id == "a3"
    assert kinds(f) == [("stale_effect_committed", "c7", 7)]
    assert f.evidence_lag is not None and f.evidence_lag.seq == 0
    assert "w3 (epoch 3)" in f.response


@pytest.mark.parametrize(("fence_id", "expected"), [("z-lost", "resolved"), ("a-lost", "open")])
@pytest.mark.parametrize("fence_first", [True, False])
def test_a_fence_and_a_stale_event_at_one_seq_are_ordered_by_event_id(
    fence_id: str, expected: str, fence_first: bool
) -> None:
    """Neither is an acquisition: `event_id` decides ("m-hb" < "z-lost"), never arrival."""
    hb = act("m-hb", "heartbeat", 17, "alpha", 6)
    lost = act(fence_id, "lease_lost", 17, "alpha", 6)
    r = audit([*takeover(), *([lost, hb] if fence_first else [hb, lost])])
    assert status(one(r)) == expected


@pytest.mark.parametrize(("verify_id", "expected"), [("z-v", "resolved"), ("a-v", "open")])
@pytest.mark.parametrize("arrival", list(itertools.permutations(range(3))))
def test_a_verification_at_the_seq_of_a_commit_is_ordered_by_event_id(
    verify_id: str, expected: str, arrival: tuple[int, ...]
) -> None:
    tail = [
        commit("m-c", 17, "alpha", 6),
        verify(verify_id, 6),
        act("l9", "lease_lost", 17, "x", 9),
    ]
    r = audit([*takeover(), *(tail[i] for i in arrival)])
    assert status(one(r)) == expected


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(4))))
def test_two_acquisitions_at_one_seq_are_ordered_by_event_id(arrival: tuple[int, ...]) -> None:
    """Epochs 3 ("b3") and 4 ("a4") acquired at seq 5, 2 stale at 6: the earliest displacing
    acquisition is a4 by id, in every arrival order."""
    events = [
        acq("a2", 2, "w2", 1),
        acq("b3", 3, "w3", 5),
        acq("a4", 4, "w4", 5),
        act("h6", "heartbeat", 2, "w2", 6),
    ]
    f = one(audit([events[i] for i in arrival]))
    assert f.transition is not None and f.transition.event_id == "a4"
    assert f.current is not None and f.current.owner_epoch == 4


# ---- §4 one side without seq: pairwise, not total --------------------------------------------


def mixed_cycle(kind: str, fence: str) -> list[OwnershipEvent]:
    """A stale event at seq 10, one without seq, then one at seq 5 and the fence at seq 7: the
    seq-10 event is after the fence by seq, so the fence does not count."""
    key = K if kind.startswith("effect") else None
    return [
        *takeover(),
        act("s10", kind, 17, "alpha", 10, key=key),
        act("h", "heartbeat", 17, "alpha"),
        act("p5", "progress", 17, "alpha", 5 + 1),
        act("f7", fence, 17, "alpha", 7),
    ]


@pytest.mark.parametrize("fence", ["lease_lost", "heartbeat_lost", "lease_released"])
@pytest.mark.parametrize("kind", ["effect_committed", "heartbeat", "progress", "effect_attempted"])
def test_a_fence_before_any_stale_event_of_its_epoch_does_not_count(kind: str, fence: str) -> None:
    f = one(audit(mixed_cycle(kind, fence)))
    assert status(f) == "open"
    # Every stale event is followed by another (a cycle): the last by seq is named, never one a
    # seq shows to be earlier.
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "s10"


@pytest.mark.parametrize("fence", ["lease_lost", "heartbeat_lost"])
def test_a_fence_after_every_stale_event_counts_in_a_mixed_history(fence: str) -> None:
    """The fence at seq 11 is after s10 by seq and after h and p6 by arrival."""
    events = [*mixed_cycle("heartbeat", fence)[:-1], act("f11", fence, 17, "alpha", 11)]
    assert status(one(audit(events))) == "resolved"


def test_the_last_stale_event_is_the_one_no_other_follows() -> None:
    """s6 arrives first, h (no seq) after it: h follows s6 and nothing follows h."""
    events = [
        *takeover(),
        act("s6", "heartbeat", 17, "alpha", 6),
        act("h", "heartbeat", 17, "alpha"),
        act("l5", "lease_lost", 17, "alpha"),
    ]
    f = one(audit(events))
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "h"
    assert status(f) == "resolved"  # the fence without seq arrived after both


def test_current_is_taken_before_the_latest_condition_by_the_pairwise_order() -> None:
    """Epoch 19's acquisition (no seq) arrives after the seq-9 commit, before the heartbeat
    without seq: the latest condition is that heartbeat, and 19 was acquired before it."""
    events = [
        *takeover(),
        commit("c9", 17, "alpha", 9),
        acq("a19", 19, "gamma"),
        act("h", "heartbeat", 17, "alpha"),
    ]
    f = one(audit(events))
    assert f.current is not None and f.current.owner_epoch == 19


# ---- §4 Time and silence: ownership_uncertain ends silence, and is no fence ------------------


def uncertain_history(t_uncertain: float, *, seq: bool = True) -> list[OwnershipEvent]:
    """17 is stale at t=10, says it is uncertain at `t_uncertain`, and beta reports t=1000."""
    return [
        acq("a17", 17, "alpha", 1 if seq else None, t=0),
        acq("a18", 18, "beta", 5 if seq else None, t=5),
        act("h6", "heartbeat", 17, "alpha", 6 if seq else None, t=10),
        act("u7", "ownership_uncertain", 17, "alpha", 7 if seq else None, t=t_uncertain),
        act("b8", "heartbeat", 18, "beta", 8 if seq else None, t=1000),
    ]


@pytest.mark.parametrize("seq", [True, False])
def test_ownership_uncertain_restarts_the_quiet_period_in_audit(seq: bool) -> None:
    assert status(one(audit(uncertain_history(20, seq=seq)))) == "resolved"  # 980 s quiet
    assert status(one(audit(uncertain_history(600, seq=seq)))) == "open"  # 400 s only


@pytest.mark.parametrize("arrival", list(itertools.permutations(range(5))))
def test_ownership_uncertain_ends_silence_in_every_arrival_order(arrival: tuple[int, ...]) -> None:
    """Even when it arrives before the acquisition that displaced it."""
    events = uncertain_history(600)
    f = one(audit([events[i] for i in arrival]))
    assert status(f) == "open"
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "h6"


def test_ownership_uncertain_restarts_a_workers_quiet_period() -> None:
    events = uncertain_history(600)
    r = worker([(0, events[0]), (1, events[1]), (10, events[2]), (500, events[3])])
    r.advance(BASE_TS + 700)  # 690 s after the stale heartbeat, 200 s after the uncertainty
    assert status(one(r)) == "open"
    r.advance(BASE_TS + 1101)
    assert status(one(r)) == "resolved"


def test_ownership_uncertain_is_no_fence() -> None:
    events = [*takeover(), act("h6", "heartbeat", 17, "alpha", 6)]
    events.append(act("u7", "ownership_uncertain", 17, "alpha", 7))
    assert status(one(audit(events))) == "open"


def test_an_ownership_uncertain_before_the_takeover_does_not_end_silence() -> None:
    """It arrives late (processing time 500), but it is from before the takeover (seq 4)."""
    events = uncertain_history(20)
    late = act("u4", "ownership_uncertain", 17, "alpha", 4)
    r = worker([(0, events[0]), (1, events[1]), (10, events[2]), (500, late)])
    r.advance(BASE_TS + 700)
    assert status(one(r)) == "resolved"


# ---- §4 ordering: a condition placed after the transition by seq -----------------------------


def test_a_later_occurrence_placed_only_by_arrival_does_not_lower_the_ordering() -> None:
    events = [
        *takeover(),
        commit("c6", 17, "alpha", 6),
        act("h", "heartbeat", 17, "alpha"),
        commit("c", 17, "alpha", key="other"),
    ]
    f = one(audit(events))
    assert (f.ordering, f.confidence) == ("authoritative_seq", "high")


def test_the_witness_names_a_condition_placed_by_seq_first() -> None:
    """The heartbeat without seq arrived first (it comes first by arrival); the commit at seq 9
    is the condition placed by seq, and is named first."""
    events = [*takeover(), act("h", "heartbeat", 17, "alpha"), commit("c9", 17, "alpha", 9)]
    f = one(audit(events))
    assert f.ordering == "authoritative_seq"
    assert f.conditions[0].event_id == "c9"


@pytest.mark.parametrize("transition_seq", [True, False])
def test_without_a_condition_placed_by_seq_the_ordering_is_arrival(transition_seq: bool) -> None:
    """No condition carries seq, or the takeover does not: arrival, so never high."""
    events = [
        acq("a17", 17, "alpha", 1),
        acq("a18", 18, "beta", 5 if transition_seq else None),
        commit("c", 17, "alpha", None if transition_seq else 9),
    ]
    f = one(audit(events))
    assert (f.ordering, f.confidence) == ("arrival", "medium")


# ---- §5 the words of a response ---------------------------------------------------------------


def retry(workers: tuple[str, str], *, acquired: bool) -> list[OwnershipEvent]:
    events = [acq("a5", 5, "una", 1)] if acquired else []
    return [
        *events,
        commit("c1", 5, workers[0], 2, key="reply-to/msg-8f2"),
        commit("c2", 5, workers[1], 3, key="reply-to/msg-8f2"),
    ]


@pytest.mark.parametrize("acquired", [True, False])
def test_a_retry_by_two_workers_names_both(acquired: bool) -> None:
    f = one(audit(retry(("una", "vic"), acquired=acquired)))
    assert "committed once by una and once by vic (epoch 5)" in f.response
    assert "twice" not in f.response


def test_a_retry_by_one_worker_says_twice() -> None:
    f = one(audit(retry(("vic", "vic"), acquired=True)))
    assert "committed twice by vic (epoch 5)" in f.response


def test_a_retry_without_an_acquisition_has_no_current_owner() -> None:
    """`current` is the highest epoch acquired before the latest condition: none here."""
    f = one(audit(retry(("una", "vic"), acquired=False)))
    assert f.current is None and f.displaced is None


def test_a_retry_after_its_acquisition_names_the_current_owner() -> None:
    f = one(audit(retry(("una", "vic"), acquired=True)))
    assert f.current is not None and (f.current.worker_id, f.current.owner_epoch) == ("una", 5)


def keyed(kind: str, eid: str, seq: int, key: str) -> OwnershipEvent:
    source = "worker" if kind == "effect_attempted" else "destination"
    return act(eid, kind, 17, "alpha", seq, key=key, source=source)


def test_a_stale_commits_response_names_each_key_by_what_happened() -> None:
    events = [
        *takeover(),
        keyed("effect_committed", "c6", 6, "k-committed"),
        keyed("effect_attempted", "t7", 7, "k-attempted"),
        keyed("effect_rejected", "r8", 8, "k-rejected"),
        keyed("effect_attempted", "t9", 9, "k-refused"),
        keyed("effect_rejected", "r10", 10, "k-refused"),
    ]
    f = one(audit(events))
    committed = f.response.split("committed", 1)[1].split(" after ", 1)[0]
    assert "k-committed" in committed
    assert "k-rejected" not in committed and "k-refused" not in committed
    assert "it attempted k-attempted" in f.response
    assert "the destination rejected k-refused (and 1 more effect key)" in f.response


def test_an_attempts_response_does_not_freeze_a_rejected_key_as_attempted() -> None:
    events = [
        *takeover(),
        keyed("effect_attempted", "t7", 7, "k-attempted"),
        keyed("effect_rejected", "r8", 8, "k-rejected"),
    ]
    f = one(audit(events))
    assert f.response.startswith("Freeze k-attempted; the destination rejected k-rejected.")


def test_a_response_names_a_few_keys_and_counts_the_rest() -> None:
    events = [*takeover()]
    events += [keyed("effect_committed", f"c{i}", 6 + i, f"key-{i:02d}") for i in range(30)]
    f = one(audit(events))
    assert "key-00, key-01 and key-02" in f.response
    assert "(and 27 more effect keys)" in f.response
    assert "key-03" not in f.response


def test_fences_beyond_what_is_kept_make_the_finding_say_its_evidence_was_cut() -> None:
    """DESIGN §4 Retention: fences that arrive against their seq order, each after the last, are
    all candidates (pairwise, none makes another redundant); beyond the few kept, the finding
    says `evidence_truncated`, and is not high."""
    top = 100 + FENCE_POINTS
    fences = [act(f"l{s}", "lease_lost", 17, "alpha", s) for s in range(top, 80, -1)]
    f = one(audit([*takeover(), act("h6", "heartbeat", 17, "alpha", 6), *fences]))
    assert status(f) == "resolved"
    assert f.evidence_truncated and f.confidence != "high"


def test_fences_against_their_seq_order_are_kept_exactly_within_the_bound() -> None:
    """Each fence is after the last stale event, or not, by its own place: a fence arriving
    before a stale event with a lower seq (against the seq order) still counts."""
    fences = [act(f"l{s}", "lease_lost", 17, "alpha", s) for s in range(100, 60, -1)]
    late = act("h50", "heartbeat", 17, "alpha", 50)  # arrives last, placed before them by seq
    f = one(audit([*takeover(), act("h6", "heartbeat", 17, "alpha", 6), *fences, late]))
    assert status(f) == "resolved"
    assert not f.evidence_truncated


def test_a_few_fences_against_their_seq_order_cut_nothing() -> None:
    fences = [act(f"l{s}", "lease_lost", 17, "alpha", s) for s in range(100, 96, -1)]
    f = one(audit([*takeover(), act("h6", "heartbeat", 17, "alpha", 6), *fences]))
    assert (status(f), f.evidence_truncated, f.confidence) == ("resolved", False, "high")


# ---- §4 (2026-12-04): a finding's ordering and transition are its conditions' own ------------


def test_a_commit_after_its_own_transition_only_by_arrival_is_not_authoritative() -> None:
    """18's acquisition (no seq) displaced the commit at seq 9 by arrival; 19's at seq 7 came
    later and is no earlier pairwise. A higher acquisition with seq before the commit is not
    its transition: the order is arrival's, and the finding is never high."""
    events = [
        acq("a17", 17, "alpha", 1),
        acq("a18", 18, "beta"),
        commit("c9", 17, "alpha", 9),
        acq("a19", 19, "gamma", 7),
    ]
    f = one(audit(events))
    assert f.transition is not None and f.transition.event_id == "a18"
    assert (f.ordering, f.confidence) == ("arrival", "medium")


def test_the_transition_is_the_first_listed_conditions_own() -> None:
    """The heartbeat at seq 3 is the first stale event, displaced by 18's acquisition (no seq)
    by arrival; the commit at seq 9 arrived before 18's acquisition and was displaced by 19's at
    seq 7. The commit is the witness placed by seq, named first, and the finding's transition is
    its own (19's), not the first stale event's."""
    events = [
        acq("a17", 17, "alpha", 1),
        acq("a19", 19, "gamma", 7),
        commit("c9", 17, "alpha", 9),
        acq("a18", 18, "beta"),
        act("h3", "heartbeat", 17, "alpha", 3),
    ]
    f = one(audit(events))
    assert (f.ordering, f.conditions[0].event_id) == ("authoritative_seq", "c9")
    assert f.transition is not None and (f.transition.event_id, f.transition.seq) == ("a19", 7)
    assert f.evidence_lag is not None and f.evidence_lag.seq == 2


def test_a_retry_is_authoritative_when_both_commits_of_one_duplicate_carry_seq() -> None:
    """Key "a" was committed twice with seq; key "b" once with seq, once without. One listed
    duplicate with both commits placed by seq is enough (DESIGN §4), and it is named first."""
    events = [
        commit("b1", 5, "una", 1, key="b"),
        commit("b2", 5, "una", key="b"),
        commit("a1", 5, "una", 2, key="a"),
        commit("a2", 5, "una", 3, key="a"),
    ]
    (f,) = audit(events).findings()
    assert f.displaced is None
    assert (f.ordering, f.conditions[0].event_id) == ("authoritative_seq", "a2")
    without = audit(events[:2]).findings()[0]
    assert without.ordering == "arrival"


def test_in_a_cycle_the_first_and_last_stale_events_are_its_earliest_and_latest_by_seq() -> None:
    """s8 (seq 8) arrives, then n (no seq), then s6 (seq 6): s6 is before s8 by seq, s8 before
    n by arrival, n before s6 by arrival. Every one follows another: the first is s6 and the
    last s8, by seq, in every arrival order of the three."""
    stale = [
        act("s8", "progress", 17, "alpha", 8, key=None),
        act("n", "progress", 17, "alpha", key=None),
        act("s6", "effect_attempted", 17, "alpha", 6, key="k"),
    ]
    f = one(audit([*takeover(), *stale]))
    assert f.last_stale_event is not None and f.last_stale_event.event_id == "s8"
    assert [c.event_id for c in f.conditions][:1] == ["s6"]


@pytest.mark.parametrize("sender", ["alpha", "checker"])
def test_a_verification_the_displaced_owner_sends_ends_its_silence(sender: str) -> None:
    """17 is stale at t=10; a verification carrying epoch 17 comes at t=600 and beta reports
    t=1000. From alpha, 17's own worker, it is a sign of life: 400 s only, open. From a checker
    it says nothing of alpha: 990 s of silence, resolved."""
    events = [
        acq("a17", 17, "alpha", 1, t=0),
        acq("a18", 18, "beta", 5, t=5),
        act("h6", "heartbeat", 17, "alpha", 6, t=10),
        act("v7", "outcome_verified", 17, sender, 7, key="k", source="verifier", t=600),
        act("b8", "heartbeat", 18, "beta", 8, t=1000),
    ]
    expected = "open" if sender == "alpha" else "resolved"
    assert status(one(audit(events))) == expected
    for arrival in itertools.permutations(range(5)):
        assert status(one(audit([events[i] for i in arrival]))) == expected
    r = worker([(0, events[0]), (1, events[1]), (10, events[2]), (500, events[3])])
    r.advance(BASE_TS + 700)  # 690 s after the stale heartbeat, 200 s after the verification
    assert status(one(r)) == ("open" if sender == "alpha" else "resolved")


@pytest.mark.parametrize("granted_before", [True, False])
def test_a_displaced_owner_granted_its_epoch_again_after_the_takeover_keeps_its_finding_open(
    granted_before: bool,
) -> None:
    """The coordinator names alpha under 17 again at seq 9, after beta's takeover (seq 5) and
    after beta's t=1000: alpha is alive, so the finding of its stale heartbeat (t=10) stays
    open. Whether 17 was acquired before (its second acquisition is folded into the first) or
    only then, and in every arrival order (the property campaign's shrunk example: the late
    acquisition first, the earlier one folded into it)."""
    events = [
        *([acq("a17", 17, "alpha", 1, t=0)] if granted_before else []),
        acq("a18", 18, "beta", 5, t=5),
        act("h6", "heartbeat", 17, "alpha", 6, t=10),
        act("b8", "heartbeat", 18, "beta", 8, t=1000),
        acq("g9", 17, "alpha", 9),
    ]
    for arrival in itertools.permutations(events):
        assert status(one(audit(arrival))) == "open", [e.event_id for e in arrival]
    r = worker([(0, e) for e in events[:-3]] + [(10, events[-3]), (500, events[-1])])
    r.advance(BASE_TS + 700)  # 690 s after the stale heartbeat, 200 s after the acquisition
    assert status(one(r)) == "open"


@pytest.mark.parametrize(("eid", "expected"), [("a", "resolved"), ("z", "open")])
def test_a_grant_at_the_takeovers_own_seq_is_after_it_only_by_event_id(
    eid: str, expected: str
) -> None:
    """Two acquisitions at one seq are ordered by event id: naming alpha under 17 again at seq
    5, the takeover's own, is a sign of life only when its id sorts after the takeover's."""
    events = [
        acq("a17", 17, "alpha", 1, t=0),
        acq("m18", 18, "beta", 5, t=5),
        act("h6", "heartbeat", 17, "alpha", 6, t=10),
        acq(eid, 17, "alpha", 5),
    ]
    r = worker([(0, events[0]), (1, events[1]), (10, events[2]), (500, events[3])])
    r.advance(BASE_TS + 700)  # 690 s after the stale heartbeat, 200 s after the acquisition
    assert status(one(r)) == expected
