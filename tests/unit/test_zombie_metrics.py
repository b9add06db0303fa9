"""How long zombies act, how late takeovers come, how long findings stay open (issue 11, part 3).

The engine observes (`FindingStats`, `LeaseStats.takeover_delay`, `Detector.oldest_open_findings`)
and decides nothing with it; the processing step's tick exports what it observed. Events go
through `PartitionProcessor` as in `test_lease_metrics`, into a fresh registry per test.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from detector.contracts.events import parse_event_json
from detector.contracts.findings import Severity, Status
from detector.core import (
    Config,
    Detector,
    FindingStats,
    FindingUpdate,
    Observations,
    decode_state,
    encode_state,
)
from detector.core._state import EPISODE_FIELDS
from detector.testing.torture.history import generate
from tests.unit.histories import ev
from tests.unit.test_lease_metrics import OCR_LABELS, Worker, acquired, event

ZOMBIE_S = "splitbrain_zombie_activity_seconds"
ZOMBIE_SEQ = "splitbrain_zombie_activity_seq"
RESOLUTION = "splitbrain_finding_resolution_seconds"
DELAY = "splitbrain_takeover_delay_seconds"
EARLY = "splitbrain_takeovers_early_total"
OLDEST = "splitbrain_findings_open_oldest_age_seconds"
WF = "wf-1"


def observed(obs: Observations) -> list[tuple[float, int]]:
    """(upper bound, count) of each bucket that counted something."""
    bounds = [*obs.bounds, float("inf")]
    return [(bounds[i], n) for i, n in enumerate(obs.counts) if n]


def counts(stats: FindingStats) -> dict[str, dict[str, int]]:
    """How many observations each histogram holds per severity (those with any)."""
    out: dict[str, dict[str, int]] = {}
    for name in ("zombie_seconds", "zombie_seq", "resolution"):
        by: dict[Severity, Observations] = getattr(stats, name)
        out[name] = {s.value: sum(o.counts) for s, o in by.items() if sum(o.counts)}
    return out


def zombie(*, seq: bool = True, times: bool = True) -> list[Any]:
    """Epoch 1 is displaced at seq 2 (t=10); it checkpoints (t=25) and commits `k` at a
    destination that ignores the fence (t=40), then learns it lost (t=45); a verifier confirms
    `k` (t=50), which resolves the critical finding."""
    rows = [
        ("a1", "lease_acquired", 1, "w1", None, None, 0),
        ("a2", "lease_acquired", 2, "w2", None, None, 10),
        ("p1", "progress", 1, "w1", None, None, 25),
        ("c1", "effect_committed", 1, "w1", "k", "destination", 40),
        ("l1", "lease_lost", 1, "w1", None, None, 45),
        ("v1", "outcome_verified", 2, "checker", "k", "verifier", 50),
    ]
    return [
        ev(
            eid,
            kind,
            WF,
            epoch,
            worker,
            seq=i + 1 if seq else None,
            key=key,
            source=source,
            t=t if times else None,
        )
        for i, (eid, kind, epoch, worker, key, source, t) in enumerate(rows)
    ]


def run(events: list[Any], at0: float = 1000.0, step: float = 10.0) -> tuple[Detector, list[Any]]:
    """Each event at the worker's time at0, at0 + step, …; the updates they caused."""
    d = Detector(Config())
    updates = []
    for i, e in enumerate(events):
        updates += d.observe(e, at=at0 + i * step)
    return d, updates


# ---- the engine -------------------------------------------------------------------------------


def test_a_zombies_activity_is_observed_once_when_its_finding_resolves() -> None:
    d, updates = run(zombie())
    statuses = [u.finding.status for u in updates]
    assert statuses[-1] is Status.RESOLVED and statuses.count(Status.RESOLVED) == 1
    stats = d.finding_stats
    # last stale event (c1, t=40, seq 4) minus the transition (a2, t=10, seq 2)
    assert observed(stats.zombie_seconds[Severity.CRITICAL]) == [(30, 1)]
    assert stats.zombie_seconds[Severity.CRITICAL].total == 30.0
    assert observed(stats.zombie_seq[Severity.CRITICAL]) == [(2, 1)]
    # opened by p1 (the 3rd event, at 1020), resolved by v1 (the 6th, at 1050)
    assert observed(stats.resolution[Severity.CRITICAL]) == [(30, 1)]
    assert stats.resolution[Severity.CRITICAL].total == 30.0
    assert counts(stats) == {
        "zombie_seconds": {"critical": 1},
        "zombie_seq": {"critical": 1},
        "resolution": {"critical": 1},
    }
    lag = updates[-1].finding.evidence_lag
    assert (lag.seq, lag.seconds) == (2, 30.0)  # the same numbers the finding publishes


def test_nothing_is_observed_while_a_finding_stays_open() -> None:
    d, updates = run(zombie()[:5])  # no verification: the committed key keeps it open
    assert {u.finding.status for u in updates} == {Status.OPEN}
    assert counts(d.finding_stats) == {"zombie_seconds": {}, "zombie_seq": {}, "resolution": {}}
    assert d.states[WF].episodes[(1, False)].opened_at == 1020.0


def test_seconds_need_both_times_and_seq_needs_authoritative_order() -> None:
    d, _ = run(zombie(times=False))
    assert counts(d.finding_stats)["zombie_seconds"] == {}
    assert counts(d.finding_stats)["zombie_seq"] == {"critical": 1}
    d, updates = run(zombie(seq=False))
    assert updates[-1].finding.ordering == "arrival"
    assert counts(d.finding_stats)["zombie_seq"] == {}
    assert counts(d.finding_stats)["zombie_seconds"] == {"critical": 1}


def test_emitter_clocks_that_would_make_the_activity_negative_observe_no_seconds() -> None:
    events = zombie()
    # the stale commit's emitter clock is behind the takeover's
    events[3] = ev("c1", "effect_committed", WF, 1, "w1", seq=4, key="k", source="destination", t=5)
    d, _ = run(events)
    assert counts(d.finding_stats)["zombie_seconds"] == {}
    assert counts(d.finding_stats)["zombie_seq"] == {"critical": 1}


def test_resolution_by_silence_is_measured_on_the_workers_clock() -> None:
    d, updates = run(zombie()[:3])  # stale activity only, opened at 1020
    assert [u.finding.severity for u in updates] == [Severity.INFO]
    quiet = d.config.quiet_period_s
    advanced = d.advance(1020.0 + quiet)
    assert [u.finding.status for u in advanced.updates] == [Status.RESOLVED]
    stats = d.finding_stats
    assert stats.resolution[Severity.INFO].total == quiet
    assert observed(stats.zombie_seconds[Severity.INFO]) == [(30, 1)]  # p1 at t=25 - a2 at t=10
    assert stats.zombie_seconds[Severity.INFO].total == 15.0
    assert d.states[WF].episodes[(1, False)].opened_at is None  # kept only while open


def test_a_reopened_finding_is_observed_again_with_the_longer_activity() -> None:
    events = [
        *zombie(),
        ev("c2", "effect_committed", WF, 1, "w1", seq=7, key="k", source="destination", t=70),
        ev("l2", "lease_lost", WF, 1, "w1", seq=8, t=75),
        ev("v2", "outcome_verified", WF, 2, "checker", seq=9, key="k", source="verifier", t=80),
    ]
    d, updates = run(events)
    changes = [u.finding.status for u in updates]
    changes = [s for i, s in enumerate(changes) if i == 0 or s is not changes[i - 1]]
    assert changes == [Status.OPEN, Status.RESOLVED, Status.OPEN, Status.RESOLVED]
    stats = d.finding_stats
    assert stats.zombie_seconds[Severity.CRITICAL].total == 30.0 + 60.0  # c2 at t=70
    assert stats.zombie_seq[Severity.CRITICAL].total == 2 + 5
    # 1020 → 1050, then reopened at 1060 (c2) → resolved at 1080 (v2)
    assert stats.resolution[Severity.CRITICAL].total == 30.0 + 20.0


def test_a_retry_has_no_zombie_but_a_time_to_resolution() -> None:
    events = [
        ev("a1", "lease_acquired", WF, 5, "w1", seq=1, t=0),
        ev("c1", "effect_committed", WF, 5, "w1", seq=2, key="k", source="destination", t=1),
        ev("c2", "effect_committed", WF, 5, "w1", seq=3, key="k", source="destination", t=2),
        ev("v1", "outcome_verified", WF, 5, "checker", seq=4, key="k", source="verifier", t=3),
    ]
    d, updates = run(events)
    assert updates[-1].finding.displaced is None
    assert updates[-1].finding.status is Status.RESOLVED
    assert counts(d.finding_stats) == {
        "zombie_seconds": {},
        "zombie_seq": {},
        "resolution": {"warning": 1},
    }


def test_audit_without_a_clock_observes_zombies_but_no_resolution_time() -> None:
    d = Detector(Config.for_audit())
    for e in zombie():
        d.observe(e)
    d.finish()
    assert counts(d.finding_stats) == {
        "zombie_seconds": {"critical": 1},
        "zombie_seq": {"critical": 1},
        "resolution": {},
    }


def test_observations_agree_with_the_published_revisions_of_a_generated_history() -> None:
    """Over thousands of events of every scenario: one observation per change of status to
    resolved, with the resolving revision's own evidence_lag, and none otherwise."""
    d = Detector(Config(quiet_period_s=30.0))
    updates: list[FindingUpdate] = []
    for i, raw in enumerate(generate(4000, seed=3)):
        updates += d.observe(parse_event_json(raw), at=float(i))
        if i % 50 == 0:
            updates += d.advance(float(i)).updates
    updates += d.advance(1e9).updates
    want: dict[str, list[float]] = {"zombie_seconds": [], "zombie_seq": []}
    status: dict[str, Status] = {}
    open_to_resolved = 0
    for u in updates:
        f = u.finding
        was = status.get(f.finding_id)
        if f.status is Status.RESOLVED and was is not Status.RESOLVED:
            open_to_resolved += was is Status.OPEN
            lag = f.evidence_lag
            if lag is not None and lag.seconds is not None:
                want["zombie_seconds"].append(lag.seconds)
            if lag is not None and lag.seq is not None and f.ordering == "authoritative_seq":
                want["zombie_seq"].append(lag.seq)
        status[f.finding_id] = f.status
    stats = d.finding_stats
    assert want["zombie_seq"], "the history resolves no finding"
    for name, values in want.items():
        by: dict[Severity, Observations] = getattr(stats, name)
        assert sum(sum(o.counts) for o in by.values()) == len(values), name
        assert sum(o.total for o in by.values()) == pytest.approx(sum(values)), name
    assert sum(sum(o.counts) for o in stats.resolution.values()) == open_to_resolved
    opened = {f.finding_id for f in (u.finding for u in updates) if f.status is Status.OPEN}
    still_open = {fid for fid, s in status.items() if s is Status.OPEN}
    assert still_open and opened - still_open  # both kinds are in the history
    assert set(d.oldest_open_findings()) == {
        ep.severity
        for st in d.states.values()
        for ep in st.episodes.values()
        if ep.revision and ep.status is Status.OPEN
    }


# ---- time to takeover -------------------------------------------------------------------------


def test_takeover_delay_is_the_acquisition_time_minus_the_last_known_lease_until() -> None:
    w = Worker().feed(
        acquired("a1", 1, t=0, until=30),
        event("h1", "heartbeat", 1, t=20, until=60, attrs={"tool_class": "ocr"}),
        acquired("a2", 2, t=75),  # 15 s after h1's lease ran out
    )
    w.tick()
    buckets = w.buckets(DELAY, **OCR_LABELS)
    assert (buckets["10.0"], buckets["15.0"], buckets["+Inf"]) == (0, 1, 1)
    assert w.value(f"{DELAY}_sum", **OCR_LABELS) == 15.0
    assert w.value(EARLY, **OCR_LABELS) == 0


def test_a_takeover_before_the_lease_ran_out_is_early_not_a_delay() -> None:
    w = Worker().feed(acquired("a1", 1, t=0, until=90), acquired("a2", 2, t=30)).tick()
    assert w.value(EARLY, **OCR_LABELS) == 1
    assert w.value(f"{DELAY}_count", **OCR_LABELS) == 0


@pytest.mark.parametrize(
    "between",
    [
        [event("r1", "lease_released", 1, t=10)],  # a handoff: no lease ran out
        [event("h1", "heartbeat", 1, t=10)],  # extended, until when is not known
    ],
)
def test_no_delay_without_a_known_lease_until(between: list[tuple[bytes, bytes]]) -> None:
    w = Worker().feed(acquired("a1", 1, t=0, until=30), *between, acquired("a2", 2, t=75))
    w.tick()
    assert w.value(f"{DELAY}_count", **OCR_LABELS) == 0
    assert w.value(EARLY, **OCR_LABELS) == 0


def test_no_delay_without_the_acquisitions_time() -> None:
    w = Worker().feed(acquired("a1", 1, t=0, until=30), acquired("a2", 2)).tick()
    assert w.value(f"{DELAY}_count", **OCR_LABELS) == 0


# ---- the worker's metrics ---------------------------------------------------------------------


def records(events: list[Any]) -> list[tuple[bytes, bytes]]:
    return [
        (e.workflow_key.encode(), e.model_dump_json(exclude_none=True).encode()) for e in events
    ]


def test_the_tick_exports_each_observation_once() -> None:
    w = Worker()
    for severity in Severity:  # every severity's series from the start, at 0
        assert w.buckets(ZOMBIE_S, severity=severity.value)["+Inf"] == 0
        assert w.buckets(RESOLUTION, severity=severity.value)["+Inf"] == 0
        assert w.buckets(ZOMBIE_SEQ, severity=severity.value)["+Inf"] == 0
    w.feed(*records(zombie())).tick().tick()
    assert w.value(f"{ZOMBIE_S}_count", severity="critical") == 1
    assert w.value(f"{ZOMBIE_S}_sum", severity="critical") == 30.0
    assert w.buckets(ZOMBIE_S, severity="critical")["30.0"] == 1
    assert w.buckets(ZOMBIE_S, severity="critical")["10.0"] == 0
    assert w.value(f"{ZOMBIE_SEQ}_sum", severity="critical") == 2
    assert w.value(f"{RESOLUTION}_count", severity="critical") == 1
    assert w.value(f"{ZOMBIE_S}_count", severity="info") == 0


def test_a_fresh_engine_for_a_partition_counts_from_zero() -> None:
    w = Worker().feed(*records(zombie())).tick()
    w.partitions[0].detector = Detector(Config())
    w.metrics.engine_replaced(0)
    w.feed(*records([e.model_copy(update={"workflow_key": "wf-2"}) for e in zombie()])).tick()
    assert w.value(f"{ZOMBIE_S}_count", severity="critical") == 2


def test_the_oldest_open_finding_per_severity_and_partition() -> None:
    w = Worker()
    w.feed(*records(zombie()[:3]))  # wf-1: info, opened at w.now
    opened = w.now
    w.now += 100
    w.feed(*records([e.model_copy(update={"workflow_key": "wf-2"}) for e in zombie()[:4]]))
    w.tick()  # wf-2: critical, opened 100 s later
    assert w.value(OLDEST, partition="0", severity="info") == w.now - opened
    assert w.value(OLDEST, partition="0", severity="critical") == w.now - opened - 100
    assert w.value(OLDEST, partition="0", severity="warning") == 0
    assert w.partitions[0].detector.oldest_open_findings() == {
        Severity.INFO: opened,
        Severity.CRITICAL: opened + 100,
    }
    w.metrics.partition_gone(0)
    assert (
        w.metrics.registry.get_sample_value(OLDEST, {"partition": "0", "severity": "info"}) is None
    )


# ---- the state --------------------------------------------------------------------------------


def test_the_opening_time_survives_the_changelog() -> None:
    d, _ = run(zombie()[:4])
    state = d.states[WF]
    assert state.episodes[(1, False)].opened_at == 1020.0
    restored = decode_state(encode_state(state))
    assert restored == state
    fresh = Detector(Config(), states={WF: restored})
    fresh.advance(1100.0)
    assert fresh.oldest_open_findings() == {Severity.CRITICAL: 1020.0}
    for e in zombie()[4:]:
        fresh.observe(e, at=1200.0)
    assert fresh.finding_stats.resolution[Severity.CRITICAL].total == 180.0


def test_a_finding_written_before_the_opening_time_still_decodes() -> None:
    d, _ = run(zombie()[:4])
    fields = msgspec.msgpack.decode(encode_state(d.states[WF]))
    row = fields[8][0]
    assert len(row) == EPISODE_FIELDS
    fields[8][0] = row[:-3]  # as the state was written before `opened_at` (and version 7)
    old = decode_state(msgspec.msgpack.encode(fields))
    ep = old.episodes[(1, False)]
    assert ep.opened_at is None
    assert ep.revision == d.states[WF].episodes[(1, False)].revision
    # it resolves as before, with no time to resolution (not known) but its zombie's activity
    fresh = Detector(Config(), states={WF: old})
    for e in zombie()[4:]:
        fresh.observe(e, at=1200.0)
    assert counts(fresh.finding_stats) == {
        "zombie_seconds": {"critical": 1},
        "zombie_seq": {"critical": 1},
        "resolution": {},
    }
    fields[8][0] = row[:-4]
    with pytest.raises(ValueError, match="damaged finding state"):
        decode_state(msgspec.msgpack.encode(fields))


def test_an_open_finding_costs_one_float_more_and_a_resolved_one_nothing() -> None:
    open_state, _ = run(zombie()[:4])
    resolved_state, _ = run(zombie())
    open_row = msgspec.msgpack.decode(encode_state(open_state.states[WF]))[8][0]
    resolved_row = msgspec.msgpack.decode(encode_state(resolved_state.states[WF]))[8][0]
    assert open_row[23] == 1020.0  # `opened_at`, then `displaced_ctx` and `dup_pending`
    assert resolved_row[23] is None
    assert json.dumps(resolved_row[23]) == "null"
