"""The fault-injection campaign's frame (bench/campaign.py): the schedule replays from its seed,
and the checker counts what the truth says against real findings of the engine."""

from __future__ import annotations

import base64
import contextlib
import json as jsonlib
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding, Severity
from detector.testing.campaign.checker import Grade, Seen, check, positives
from detector.testing.campaign.driver import SourceResult
from detector.testing.campaign.kills import Kills
from detector.testing.campaign.nemesis import Fault, Step, plan
from detector.testing.campaign.report import percentile, summary, table
from detector.testing.campaign.source import CampaignEnv, KafkaOutages, RunEnv
from detector.testing.campaign.sources import _election, load
from detector.testing.campaign.truth import (
    HEARD_EARLY,
    HEARD_LATE,
    KILLED_UNSENT,
    PROCESS_ENV,
    SHUTDOWN_UNSENT,
    TruthLog,
    Write,
    heard_early,
    heard_late,
)

from .histories import acq, commit, ev, run

WF = "orders/o-1"
SEQ_DESTINATION = Grade("authoritative_seq", destination_confirms=True)
ARRIVAL = Grade("arrival", destination_confirms=True)
FAULTS = frozenset(Fault) - {Fault.BROKER_RESTART}


def schedule(seed: int, n: int = 0) -> tuple[Step, ...]:
    return plan(
        seed, n, FAULTS, workers=3, span_s=10.0, steps=4, holds={Fault.PAUSE_PAST_LEASE: (4, 6)}
    )


def test_a_seed_replays_its_schedule_and_another_seed_does_not() -> None:
    assert schedule(7) == schedule(7)
    assert schedule(7, 1) == schedule(7, 1)
    assert len({schedule(s) for s in range(20)}) == 20
    assert schedule(7) != schedule(7, 1)


def test_a_schedule_is_in_time_order_on_the_fleet_with_each_faults_hold() -> None:
    steps = [
        s
        for seed in range(50)
        for s in plan(
            seed, 0, FAULTS, workers=3, span_s=10.0, steps=4, holds={Fault.PAUSE_PAST_LEASE: (4, 6)}
        )
    ]
    assert {s.fault for s in steps} == FAULTS
    assert all(0 <= s.target < 3 and 0.5 <= s.at_s <= 10.0 for s in steps)
    assert all(4 <= s.hold_s <= 6 for s in steps if s.fault is Fault.PAUSE_PAST_LEASE)
    for seed in range(50):
        offsets = [s.at_s for s in schedule(seed)]
        assert offsets == sorted(offsets)


def write(key: str, executor: str, epoch: int, *, owned: bool, at: float, **kw: object) -> Write:
    return Write.model_validate(
        {
            "run": 0,
            "workflow_key": WF,
            "effect_key": key,
            "executor": executor,
            "epoch": epoch,
            "owned": owned,
            "evidence": f"token {epoch}",
            "at": at,
            **kw,
        }
    )


def seen(findings: list[Finding], at: float) -> list[Seen]:
    return [Seen(f, at) for f in findings]


def zombie_findings(seq: bool = True) -> list[Finding]:
    """w1 (epoch 1) is displaced by w2 (epoch 2), which commits the charge; then w1 commits it."""
    s = (lambda n: n) if seq else (lambda n: None)
    r = run(
        [
            acq("a1", 1, "w1", s(1), WF),
            acq("a2", 2, "w2", s(2), WF),
            commit("c2", 2, "w2", s(3), key="charge", wf=WF),
            commit("c1", 1, "w1", s(4), key="charge", wf=WF),
        ]
    )
    return [u.finding for u in r.updates]


def test_a_stale_commit_its_finding_names_is_a_true_positive_with_its_latency() -> None:
    truth = [
        write("charge", "w2", 2, owned=True, at=100.0),
        write("charge", "w1", 1, owned=False, at=101.0),
    ]
    v = check(truth, seen(zombie_findings(), 101.4), SEQ_DESTINATION)
    assert (v.true_positives, v.false_negatives, v.false_positives, v.misgraded) == (1, 0, 0, 0)
    assert v.latencies_s == [pytest.approx(0.4)]


def test_a_stale_write_no_finding_names_is_a_miss_and_a_blind_one_is_counted_apart() -> None:
    truth = [
        write("charge", "w1", 1, owned=False, at=101.0),
        write("email", "w1", 1, owned=False, at=102.0, blind="unreported_exit"),
    ]
    v = check(truth, [], SEQ_DESTINATION, blind=["unreported_exit"])
    assert (v.true_positives, v.false_negatives, v.blind) == (0, 1, 1)
    assert v.notes == [f"missed: run 0 {WF}: stale write of charge by w1 epoch 1 (token 1)"]
    undeclared = check(truth[1:], [], SEQ_DESTINATION)
    assert undeclared.notes == ["blind spot 'unreported_exit' not declared by the source"]


def test_a_finding_no_stale_write_explains_is_a_false_positive() -> None:
    truth = [write("charge", "w2", 2, owned=True, at=100.0)]
    v = check(truth, seen(zombie_findings(), 101.0), SEQ_DESTINATION)
    assert (v.true_positives, v.false_positives) == (0, 1)
    assert v.notes[0].startswith(f"false alarm: critical {WF} displaced 1")


def test_an_info_finding_of_a_heartbeat_is_never_a_false_positive() -> None:
    r = run(
        [
            acq("a1", 1, "w1", 1, WF),
            acq("a2", 2, "w2", 2, WF),
            ev("h1", "heartbeat", WF, 1, "w1", seq=3),
        ]
    )
    v = check([], seen([u.finding for u in r.updates], 1.0), SEQ_DESTINATION)
    assert (v.false_positives, v.info_only) == (0, 1)


def test_a_finding_graded_below_what_the_source_can_show_is_misgraded() -> None:
    truth = [
        write("charge", "w2", 2, owned=True, at=100.0),
        write("charge", "w1", 1, owned=False, at=101.0),
    ]
    arrival = check(truth, seen(zombie_findings(seq=False), 102.0), SEQ_DESTINATION)
    assert (arrival.true_positives, arrival.misgraded) == (1, 1)
    assert arrival.notes == [
        f"misgraded {WF}: ordering arrival (want authoritative_seq); confidence medium (want high)"
    ]
    assert (
        check(truth, seen(zombie_findings(seq=False), 102.0), Grade("arrival", True)).misgraded == 0
    )


def late_commit_findings(*after: OwnershipEvent) -> list[Finding]:
    """Without seq: w1 (epoch 1) commits `charge`, but w2's acquisition (epoch 2) arrives
    before that commit does; then `after`."""
    late = commit("c1", 1, "w1", None, key="charge", wf=WF)
    r = run([acq("a1", 1, "w1", None, WF), acq("a2", 2, "w2", None, WF), late, *after])
    return [u.finding for u in r.updates]


def test_an_owned_write_heard_after_the_next_takeover_is_blind_never_a_false_alarm() -> None:
    """The redis-lock campaign's false critical (seed 1): a holder paused (or shut down) right
    after a write, its commit still in its sink, was heard after the next holder's acquisition,
    so arrival rightly made it stale (DESIGN §4: critical, arrival, medium). The truth marks it
    heard late: counted blind, the finding graded as what it heard, and never a miss excused."""
    late = write("charge", "w1", 1, owned=True, at=100.0, blind=HEARD_LATE)
    v = check([late], seen(late_commit_findings(), 103.0), ARRIVAL, blind=[HEARD_LATE])
    assert (v.false_positives, v.blind, v.misgraded, v.notes) == (0, 1, 0, [])
    unmarked = late.model_copy(update={"blind": None})
    assert check([unmarked], seen(late_commit_findings(), 103.0), ARRIVAL).false_positives == 1
    # Woken, the holder's fenced write is refused: a real stale write (a warning), in a finding
    # the late commit rightly makes critical.
    refused = ev("r1", "effect_rejected", WF, 1, "w1", key="refund", source="destination")
    stale = write("refund", "w1", 1, owned=False, at=104.0, committed=False)
    v = check([late, stale], seen(late_commit_findings(refused), 104.5), ARRIVAL, [HEARD_LATE])
    assert (v.true_positives, v.false_positives, v.misgraded, v.blind) == (1, 0, 0, 1), v.notes
    redone = write("charge", "w2", 2, owned=True, at=105.0, blind=HEARD_LATE)
    assert check([late, redone], [], ARRIVAL, [HEARD_LATE]).false_negatives == 1


def test_an_owned_write_an_acquisition_of_a_higher_epoch_soon_followed_is_marked_heard_late(
    tmp_path: Path,
) -> None:
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    writes = [
        write("a", "w1", 1, owned=True, at=90.0),  # 4 s before w2's acquisition: sent by then
        write("b", "w1", 1, owned=True, at=92.5),  # 1.5 s before it: maybe still unsent
        write("c", "w1", 1, owned=True, at=93.0, blind=KILLED_UNSENT),  # never heard at all
        write("d", "w1", 1, owned=False, at=95.0),  # stale: a positive, not late
        write("e", "w2", 2, owned=True, at=95.0),  # nobody took it from w2
        # Its reply held back by a partition, heard 1.5 s before the acquisition (CI, 2026-12-05:
        # a 5.4 s partition of the redis-lock campaign's worker, a critical finding).
        write("f", "w1", 1, owned=True, at=86.0, heard=92.5),
        write("g", "w1", 1, owned=True, at=86.0, heard=86.1),  # heard at once: sent by then
    ]
    truth.rewrite(writes)
    heard_late(truth, [(WF, 1, 80.0), (WF, 2, 94.0), ("other", 3, 95.0)], within_s=3.0)
    marks = [w.blind for w in truth.writes()]
    assert marks == [None, HEARD_LATE, KILLED_UNSENT, None, None, HEARD_LATE, None]


def refused_before_takeover_findings(*, takeover_first: bool) -> list[Finding]:
    """Without seq: w1 (epoch 1) is displaced by w2 (epoch 2), then its fenced write of `charge`
    is refused; the refusal arrives before w2's acquisition unless `takeover_first`."""
    takeover = acq("a2", 2, "w2", None, WF)
    refused = ev("r1", "effect_rejected", WF, 1, "w1", key="charge", source="destination")
    heard = [takeover, refused] if takeover_first else [refused, takeover]
    r = run([acq("a1", 1, "w1", None, WF), *heard])
    return [u.finding for u in r.updates]


def test_a_stale_write_heard_before_its_takeover_is_blind_unless_a_finding_names_it() -> None:
    """The redis-lock campaign's miss (b59b63a, seed 1, run 22): a broker restart held both the
    successor's `lease_acquired` and the displaced holder's refused write in their sinks, and on
    the broker's return the refusal went first. Ordered by arrival it is inside the holder's own
    tenure, so no finding can call it stale: counted blind (`HEARD_EARLY`), never a miss; found
    when heard in order."""
    stale = write("charge", "w1", 1, owned=False, at=101.0, committed=False, blind=HEARD_EARLY)
    redis_lock = load("redis-lock").blind
    early = seen(refused_before_takeover_findings(takeover_first=False), 103.0)
    assert not [s for s in early if s.finding.severity is not Severity.INFO]
    v = check([stale], early, ARRIVAL, redis_lock)
    assert (v.true_positives, v.false_negatives, v.blind, v.notes) == (0, 0, 1, [])
    unmarked = stale.model_copy(update={"blind": None})
    assert check([unmarked], early, ARRIVAL, redis_lock).false_negatives == 1
    in_order = seen(refused_before_takeover_findings(takeover_first=True), 101.5)
    v = check([stale], in_order, ARRIVAL, redis_lock)
    assert (v.true_positives, v.blind, v.false_positives, v.misgraded) == (1, 0, 0, 0), v.notes


def test_a_stale_write_soon_after_its_takeover_or_inside_an_outage_is_marked_heard_early(
    tmp_path: Path,
) -> None:
    """Run 22's times: Kafka down from 4.3 to 14.1 s, shard 0 acquired with fence 2 at 6.2 s
    while it was down, the displaced holder's write refused at 9.0 s."""
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    truth.rewrite(
        [
            write("a", "w1", 1, owned=False, at=9.0, committed=False),  # run 22's
            write("b", "w1", 1, owned=False, at=14.5),  # just after the broker's return
            write("c", "w1", 1, owned=False, at=16.0),  # 1.9 s after it: w2's event was sent
            write("d", "w1", 1, owned=True, at=5.0),  # owned: never heard early
            write("e", "w3", 3, owned=False, at=25.5),  # 0.5 s after its takeover (epoch 4)
            write("f", "w1", 1, owned=False, at=25.5),  # epoch 3 took over at 20 s: heard by then
            write("g", "w1", 1, owned=False, at=9.5, blind=KILLED_UNSENT),  # never heard
        ]
    )
    acquired = [(WF, 1, 0.0), (WF, 2, 6.2), (WF, 3, 20.0), (WF, 4, 25.0), ("other", 5, 9.0)]
    heard_early(truth, acquired, within_s=1.0, outages=[(4.3, 14.1)])
    early = [w.effect_key for w in truth.writes() if w.blind == HEARD_EARLY]
    assert early == ["a", "b", "e"]
    quiet = TruthLog(tmp_path / "quiet.jsonl", run=0)
    quiet.rewrite([write("a", "w1", 1, owned=False, at=9.0)])
    heard_early(quiet, acquired, within_s=1.0)  # no outage: w2's acquisition was sent at once
    assert [w.blind for w in quiet.writes()] == [None]


def test_a_key_written_again_is_a_duplicate_critical_across_epochs_a_warning_within_one() -> None:
    across = positives(
        [
            write("charge", "w1", 1, owned=True, at=1.0),
            write("charge", "w2", 2, owned=True, at=2.0),
        ]
    )
    within = positives(
        [
            write("charge", "w1", 1, owned=True, at=1.0),
            write("charge", "w1", 1, owned=True, at=2.0),
            write("refund", "w1", 1, owned=True, at=3.0, committed=False),
        ]
    )
    assert [(p.duplicate, p.critical) for p in across] == [(True, True)]
    assert [(p.duplicate, p.critical) for p in within] == [(True, False)]


def test_the_truth_log_is_shared_by_processes_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = TruthLog(tmp_path / "truth.jsonl", run=3)
    for name, value in log.env().items():
        monkeypatch.setenv(name, value)
    worker_side = TruthLog.from_env()
    assert worker_side is not None
    made = worker_side.record(
        workflow_key=WF, effect_key="charge", executor="w1", epoch=1, owned=False, evidence="x"
    )
    assert list(log.writes()) == [made]
    assert made.run == 3


def test_the_table_and_json_carry_the_counts_and_latency_percentiles() -> None:
    truth = [
        write("charge", "w2", 2, owned=True, at=100.0),
        write("charge", "w1", 1, owned=False, at=101.0),
    ]
    result = SourceResult(
        "leases", 1, 2, check(truth, seen(zombie_findings(), 101.5), SEQ_DESTINATION), 2
    )
    row = summary(result)
    assert {k: row[k] for k in ("true_positives", "false_positives", "false_negatives")} == {
        "true_positives": 1,
        "false_positives": 0,
        "false_negatives": 0,
    }
    assert row["recall"] == 1.0 and row["latency_s"]["p95"] == pytest.approx(0.5)
    assert table([row]).splitlines()[2].split()[:6] == ["leases", "2", "2", "1", "0", "0"]
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0 and percentile([], 0.95) is None


def test_a_positive_found_later_than_the_target_is_listed_with_its_runs_faults_near_it() -> None:
    """The p95 says how slow, the list says which: each slow positive with its run's faults from
    ten seconds before it to its finding (an earlier one left out), slowest first."""
    truth = [
        write("charge", "w2", 2, owned=True, at=100.0),
        write("charge", "w1", 1, owned=False, at=101.0),
    ]
    steps = (
        Step(1.0, Fault.CRASH_RESTART, 0, 1.0),  # ended 15 s before the write: not near
        Step(12.0, Fault.PAUSE_PAST_LEASE, 1, 5.0),
        Step(19.0, Fault.CLOCK_STEP, 2, -2.0),  # a step's hold is its hours
        Step(30.0, Fault.PARTITION, 2, 1.0),  # after the finding
    )
    slow = check(truth, seen(zombie_findings(), 104.5), SEQ_DESTINATION)
    row = summary(SourceResult("leases", 1, 1, slow, 2, schedules={0: (84.0, steps)}))
    assert row["slow"] == [
        {
            "run": 0,
            "workflow_key": WF,
            "effect_key": "charge",
            "kind": "stale",
            "executor": "w1",
            "process": None,
            "epoch": 1,
            "blind": None,
            "at_s": 17.0,
            "latency_s": 3.5,
            "faults": [
                "12.0s pause_past_lease worker 1 (5s)",
                "19.0s clock_step worker 2 (-2h)",
            ],
        }
    ]
    assert f"  run 0 {WF} stale charge epoch 1 at 17 s: 3.50 s; faults: 12.0s" in table([row])
    fast = check(truth, seen(zombie_findings(), 102.0), SEQ_DESTINATION)
    assert summary(SourceResult("leases", 1, 1, fast, 2))["slow"] == []


def test_a_key_committed_by_each_owner_in_turn_is_explained_by_each_owners_finding() -> None:
    """Epochs 1, 2 and 3 commit one key in turn (the lease store: a crash after the effect, then
    a restart of the store): two failover duplicates, each a finding of the owner just before
    it. The second duplicate's finding is not the first one's, though that one lists the key
    too."""
    r = run(
        [
            acq("a1", 1, "w1", 1, WF),
            commit("c1", 1, "w1", 2, key="charge", wf=WF),
            acq("a2", 2, "w1", 3, WF),
            commit("c2", 2, "w1", 4, key="charge", wf=WF),
            acq("a3", 3, "w2", 5, WF),
            commit("c3", 3, "w2", 6, key="charge", wf=WF),
        ]
    )
    truth = [
        write("charge", "w1", 1, owned=True, at=100.0),
        write("charge", "w1", 2, owned=True, at=101.0),
        write("charge", "w2", 3, owned=True, at=102.0),
    ]
    v = check(truth, seen([u.finding for u in r.updates], 103.0), SEQ_DESTINATION)
    assert (v.true_positives, v.false_positives, v.misgraded) == (2, 0, 0), v.notes


def test_a_stale_commit_of_a_key_an_earlier_owner_committed_explains_that_owner_s_finding() -> None:
    """w1 commits under epoch 1 and loses the job; w2 is displaced by epoch 3 before it commits,
    then commits anyway (stale), then epoch 3 commits. The stale commit is also a failover
    duplicate of epoch 1's, which DESIGN §4 puts in epoch 1's finding: that finding is explained
    by the stale write, not a false alarm."""
    r = run(
        [
            acq("a1", 1, "w1", 1, WF),
            commit("c1", 1, "w1", 2, key="charge", wf=WF),
            acq("a2", 2, "w2", 3, WF),
            acq("a3", 3, "w3", 4, WF),
            commit("c2", 2, "w2", 5, key="charge", wf=WF),
            commit("c3", 3, "w3", 6, key="charge", wf=WF),
        ]
    )
    truth = [
        write("charge", "w1", 1, owned=True, at=100.0),
        write("charge", "w2", 2, owned=False, at=101.0),
        write("charge", "w3", 3, owned=True, at=102.0),
    ]
    v = check(truth, seen([u.finding for u in r.updates], 103.0), SEQ_DESTINATION)
    assert (v.true_positives, v.false_positives, v.misgraded) == (2, 0, 0), v.notes


def test_a_write_made_while_kafka_was_down_is_timed_from_the_brokers_return_too() -> None:
    """A broker restart holds the zombie's events until it serves again (late, never lost): the
    report shows the detector's part apart, and the p95 of the runs without a restart."""
    truth = [
        write("charge", "w2", 2, owned=True, at=100.0),
        write("charge", "w1", 1, owned=False, at=101.0),
    ]
    outages = [(100.5, 128.0)]
    verdict = check(
        truth, seen(zombie_findings(), 131.0), SEQ_DESTINATION, (), outages, restarted_runs={0}
    )
    result = SourceResult("leases", 1, 1, verdict, 2, outages=outages, restarted_runs={0})
    row = summary(result)
    assert row["latency_s"]["max"] == pytest.approx(30.0)
    assert row["latency_after_outage_s"]["max"] == pytest.approx(3.0)
    assert row["latency_without_broker_restart_s"]["p95"] is None
    quiet = summary(
        SourceResult(
            "leases", 1, 1, check(truth, seen(zombie_findings(), 131.0), SEQ_DESTINATION), 2
        )
    )
    assert quiet["latency_without_broker_restart_s"]["p95"] == pytest.approx(30.0)
    assert row["broker_outages_s"] == [27.5]
    assert "1 found write(s) made while it was down, found 3.00 s (p50)" in table([row])


def test_a_kill_during_a_kafka_outage_silences_every_write_since_the_outage_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter holds a down Kafka's events in memory: a SIGKILL then drops all of them, not
    only the last second's. Killed while Kafka serves, only the last batch is lost."""
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    writes = [
        write("a", "w1", 1, owned=True, at=90.0),  # before the outage: sent
        write("b", "w1", 1, owned=False, at=95.0),  # during it: held, then killed
        write("b", "w2", 2, owned=True, at=97.0),  # a duplicate only the killed write makes
        write("c", "w3", 1, owned=False, at=95.0),  # another worker, never killed
    ]
    truth.rewrite(writes)
    kills = Kills(KafkaOutages(spans=[(92.0, 130.0)]))
    monkeypatch.setattr("detector.testing.campaign.kills.time.time", lambda: 100.0)
    kills.note("w1", Step(0.0, Fault.CRASH_RESTART, 0, 1.0))
    kills.mark(truth)
    assert [(w.effect_key, w.executor, w.blind) for w in truth.writes()] == [
        ("a", "w1", None),
        ("b", "w1", KILLED_UNSENT),
        ("c", "w3", None),
        ("b", "w2", KILLED_UNSENT),
    ]
    in_service = Kills(KafkaOutages())
    truth.rewrite(writes)
    in_service.note("w1", Step(0.0, Fault.CRASH_RESTART, 0, 1.0))
    in_service.mark(truth)
    assert all(w.blind is None for w in truth.writes())


def shut_down(
    kills: Kills, monkeypatch: pytest.MonkeyPatch, *, at: float, gone: float, target: str = "w1"
) -> None:
    """A graceful shutdown signalled at `at` whose process has exited at `gone`."""
    clock = iter((at, gone))
    monkeypatch.setattr("detector.testing.campaign.kills.time.time", lambda: next(clock))
    with kills.exiting(target, Step(0.0, Fault.GRACEFUL_SHUTDOWN, 0, 1.0)):
        pass


def test_a_shutdown_during_a_kafka_outage_longer_than_the_exit_flush_silences_its_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graceful shutdown flushes at exit within 5 s: when Kafka stays down past that, what the
    adapter held is counted as dropped and lost; when Kafka is back sooner, nothing is."""
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    writes = [write("b", "w1", 1, owned=False, at=95.0)]
    for outage, gone, blind in (
        ((92.0, 110.0), 105.1, SHUTDOWN_UNSENT),
        ((92.0, 103.0), 103.2, None),
    ):
        truth.rewrite(writes)
        kills = Kills(KafkaOutages(spans=[outage]))
        shut_down(kills, monkeypatch, at=100.0, gone=gone)
        kills.mark(truth)
        assert [w.blind for w in truth.writes()] == [blind]


def test_a_shutdown_whose_exit_flush_meets_the_next_outage_silences_its_last_task_and_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery run 16 of 50b6f43: SIGTERM 5 s into an outage that ended 0.4 s later; the worker
    finished its task (its write after the signal), and its exit flush met the next broker
    restart, 0.25 s after the first, so the 15 events it held since the first outage were
    dropped at exit (logged).
    The task's redelivery to another worker is then a duplicate no event can show."""
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    writes = [
        write("a", "w1", 1, owned=True, at=95.0),  # before the first outage: sent
        write("b", "w1", 1, owned=True, at=97.17),  # held since the first outage
        write("c", "w1", 1, owned=True, at=101.85),  # the task finished after the signal
        write("c", "w2", 2, owned=True, at=106.68),  # its redelivery
    ]
    truth.rewrite(writes)
    kills = Kills(KafkaOutages(spans=[(96.25, 101.84), (102.09, 107.74)]))
    shut_down(kills, monkeypatch, at=101.4, gone=107.4)
    kills.mark(truth)
    assert [(w.effect_key, w.executor, w.blind) for w in truth.writes()] == [
        ("a", "w1", None),
        ("b", "w1", SHUTDOWN_UNSENT),
        ("c", "w1", SHUTDOWN_UNSENT),
        ("c", "w2", SHUTDOWN_UNSENT),
    ]


def test_a_kill_silences_the_writes_its_process_made_whatever_executor_ids_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An etcd or Kubernetes worker's executor is a lease or an identity each start (or each
    election) takes anew: the kill is the process's, and its writes name the process."""
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    writes = [
        write("a", "lease-1a", 1, owned=False, at=95.0, process="w1"),
        write("b", "lease-2b", 2, owned=True, at=96.0, process="w1"),  # its next lock
        write("c", "lease-3c", 3, owned=False, at=95.0, process="w2"),  # never killed
    ]
    truth.rewrite(writes)
    kills = Kills(KafkaOutages(spans=[(92.0, 130.0)]))
    monkeypatch.setattr("detector.testing.campaign.kills.time.time", lambda: 100.0)
    kills.note("w1", Step(0.0, Fault.CRASH_RESTART, 1, 1.0))
    kills.mark(truth)
    assert [(w.executor, w.blind) for w in truth.writes()] == [
        ("lease-1a", KILLED_UNSENT),
        ("lease-3c", None),
        ("lease-2b", KILLED_UNSENT),
    ]


def test_the_election_fleet_names_its_workers_in_their_writes_and_marks_their_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The etcd and Kubernetes fleets: a worker's write in the second before its SIGKILL may
    have died with its events, so it is counted blind (a blind spot both sources declare), not
    missed."""
    run_env = RunEnv(
        CampaignEnv({}, "in", tmp_path, seed=0),
        0,
        TruthLog(tmp_path / "truth.jsonl", run=0),
        random.Random(0),
        tmp_path,
    )
    proc = _election.worker(run_env, "w0", ["sleep", "60"], tmp_path / "clock-w0")
    for name in (*run_env.truth.env(), PROCESS_ENV):
        monkeypatch.setenv(name, proc.env[name])
    worker_side = TruthLog.from_env()
    assert worker_side is not None
    worker_side.record(
        workflow_key=WF, effect_key="charge", executor="lease-7f", epoch=1, owned=True, evidence=""
    )
    fleet = _election.ElectionFleet(
        [proc.start()],
        [],
        [tmp_path / "clock-w0"],
        done=lambda: True,
        restart_coordinator=time.sleep,
        kills=Kills(KafkaOutages()),
        truth=run_env.truth,
    )
    fleet.apply(Step(0.0, Fault.CRASH_RESTART, 0, 30.0))
    fleet.close()
    assert [(w.process, w.blind) for w in run_env.truth.writes()] == [("w0", KILLED_UNSENT)]
    for name in ("etcd", "kubernetes"):
        assert {KILLED_UNSENT, SHUTDOWN_UNSENT} <= set(load(name).blind), name


class LedgerEtcd:
    """etcd as `recover` reads it: the run's ledger keys, and the lock key at a revision."""

    def __init__(self, ledger: dict[str, tuple[dict[str, object], int]], holder_at: int) -> None:
        self.ledger = ledger
        self.holder_at = holder_at  # the lock key's create_revision at any revision asked

    def get_url(self, path: str) -> str:
        return path

    def post(self, url: str, json: dict[str, object]) -> dict[str, object]:
        if "range_end" in json:
            kvs = [
                {"key": b64(k), "value": b64(jsonlib.dumps(v)), "mod_revision": str(rev)}
                for k, (v, rev) in self.ledger.items()
            ]
            return {"kvs": kvs}
        return {"kvs": [{"create_revision": str(self.holder_at), "lease": "43"}]}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_write_whose_writer_died_before_recording_it_is_recovered_from_etcd(
    tmp_path: Path,
) -> None:
    """SIGKILL between etcd's write and its record left a write out of the truth, and the
    detector's right duplicate counted as a false alarm (etcd campaign, seed 1, run 7)."""
    pytest.importorskip("etcd3gw")
    from detector.testing.campaign.etcd_worker import recover  # noqa: PLC0415

    truth = TruthLog(tmp_path / "truth.jsonl", run=7)
    truth.record(
        workflow_key="/locks/r/shard-2",
        effect_key="shard-2/unit-1",
        executor="lease-1a",
        epoch=772,
        owned=True,
        evidence="",
    )
    made = {"epoch": 772, "at": 12.5, "process": "w2"}
    etcd = LedgerEtcd(
        {
            "/r/ledger/shard-2/unit-1/lease-1a": (made, 800),  # recorded by its writer
            "/r/ledger/shard-2/unit-2/lease-1a": (made, 801),  # its writer died first
        },
        holder_at=772,
    )
    assert recover(etcd, "r", truth) == 1  # type: ignore[arg-type]
    recovered = list(truth.writes())[-1]
    assert (recovered.effect_key, recovered.executor, recovered.epoch) == (
        "shard-2/unit-2",
        "lease-1a",
        772,
    )
    assert recovered.owned and recovered.process == "w2" and recovered.at == 12.5
    assert recovered.workflow_key == "/locks/r/shard-2"


def test_an_attempt_neither_makes_nor_hides_a_duplicate_a_kill_silenced(tmp_path: Path) -> None:
    """etcd, seed 1, run 7 (no broker restart): w2 attempted and wrote a unit, displaced, and
    was killed with the events; w0's attempt between them made the redo look heard, and the
    redo's duplicate, which only the silenced write makes, was counted a miss."""
    truth = TruthLog(tmp_path / "truth.jsonl", run=7)
    kills = Kills(KafkaOutages())

    def made(process: str, epoch: int, *, attempt: bool = False, owned: bool = True) -> None:
        TruthLog(truth.path, 7, process).record(
            workflow_key=WF,
            effect_key="unit-0",
            executor=f"lease-{epoch}",
            epoch=epoch,
            owned=owned,
            evidence="",
            attempt=attempt,
        )

    made("w2", 766, attempt=True)
    made("w0", 774, attempt=True)
    made("w2", 766, owned=False)
    kills.note("w2", Step(0.0, Fault.CRASH_RESTART, 2, 3.0))
    made("w0", 774)
    kills.mark(truth)
    assert [w.blind for w in truth.writes()] == [
        KILLED_UNSENT,
        None,
        KILLED_UNSENT,
        KILLED_UNSENT,  # the redo: a duplicate only of the silenced write
    ]


class LeasesAt:
    """The API server's Lease list at an exact resourceVersion: holder and acquireTime by it."""

    def __init__(self, held: dict[str, tuple[str, str]]) -> None:
        self.held = held
        self.asked: list[str] = []

    def list_namespaced_lease(self, namespace: str, **kw: Any) -> Any:
        assert kw["resource_version_match"] == "Exact"
        self.asked.append(kw["resource_version"])
        holder, since = self.held[kw["resource_version"]]
        spec = SimpleNamespace(holder_identity=holder, acquire_time=since)
        return SimpleNamespace(items=[SimpleNamespace(spec=spec)])


def test_a_kubernetes_write_whose_writer_died_before_recording_it_is_recovered(
    tmp_path: Path,
) -> None:
    """kubernetes, seed 1, run 2: w0's write of shard-0/unit-2 was answered, then its record's
    Lease read waited out the API server's restart and the nemesis killed w0; the detector's
    right duplicate (w2 redid the unit) counted as a false alarm."""
    pytest.importorskip("kubernetes")
    from detector.testing.campaign.kube_worker import made_path, recover  # noqa: PLC0415

    truth = TruthLog(tmp_path / "truth.jsonl", run=2)
    key = "default/c-r2-shard-0"
    truth.record(
        workflow_key=key,
        effect_key="shard-0/unit-1",
        executor="w0-1",
        epoch=0,
        owned=True,
        evidence="",
    )
    won = "2026-12-05T07:32:32.803409+00:00"

    def made(unit: int, rv: int) -> str:
        return jsonlib.dumps(
            {
                "workflow_key": key,
                "executor": "w0-1",
                "epoch": 0,
                "lease": "c-r2-shard-0",
                "effect_key": f"shard-0/unit-{unit}",
                "rv": rv,
                "won_at": won,
                "at": 12.5,
                "process": "w0",
            }
        )

    made_path(truth.path).write_text(f"{made(1, 416)}\n{made(2, 421)}\n{made(3, 460)[:20]}")
    leases = LeasesAt({"421": ("w0-1", won)})
    assert recover(leases, "default", truth) == 1
    assert leases.asked == ["421"]  # the recorded write is not judged again
    recovered = list(truth.writes())[-1]
    assert (recovered.effect_key, recovered.executor, recovered.epoch) == (
        "shard-0/unit-2",
        "w0-1",
        0,
    )
    assert recovered.owned and recovered.process == "w0" and recovered.at == 12.5
    assert "resourceVersion 421" in recovered.evidence
    assert recover(leases, "default", truth) == 0


class ShardConfigMap:
    """A shard's ConfigMap (its cursor and its units' keys), and a Lease another holds."""

    def __init__(self) -> None:
        self.data = {"cursor": "0"}
        self.rv = 5298

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(data=dict(self.data))

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any) -> Any:
        self.data.update(body["data"])
        self.rv += 1
        return SimpleNamespace(metadata=SimpleNamespace(resource_version=str(self.rv)))

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any) -> None:
        self.data = dict(body.data)

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(spec=SimpleNamespace(holder_identity="w1-2"))


def test_a_kubernetes_worker_s_leadership_ends_after_the_unit_it_began_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kubernetes, seed 1, run 26 (50b6f43): w0 lost its Lease with a unit under way, and its
    elector returned at once. Under a stop order the worker counted the leadership ended, closed
    its sink and exited, and the unit's stale write, made a second later, was dropped unsent."""
    pytest.importorskip("kubernetes")
    from detector.adapters.kubernetes import LeadershipLostError, _raise_in  # noqa: PLC0415
    from detector.testing.campaign import kube_worker  # noqa: PLC0415

    class Elector:
        """Leads at once. With the work's first unit under way, the stop order comes and the
        lease is lost: it raises in the work's thread and waits for that thread, as
        `LeaderElector` does (`stop_timeout`), not for the unit thread the work began."""

        def __init__(self, name: str, namespace: str, identity: str, work: Any, *a: Any, **kw: Any):
            self.work = work
            self.lock = SimpleNamespace(acquired=None)
            self.ownership = object()
            self.attempt_resource_version: int | None = 5116
            self.began = threading.Event()
            self.reported: list[tuple[str, int]] = []
            made.append(self)

        def attempt(self, key: str, **kw: Any) -> bool:
            self.began.set()
            return True

        def committed(self, key: str, rv: int, **kw: Any) -> bool:
            self.reported.append((key, rv))
            return True

        def run(self) -> None:
            def lead() -> None:
                with contextlib.suppress(LeadershipLostError):
                    self.work(threading.Event())

            leading = threading.Thread(target=lead, daemon=True)
            leading.start()
            assert self.began.wait(5)
            assert leading.ident is not None
            worker.orders.stopping.set()  # the run's end: the worker exits once all resigned
            _raise_in(leading.ident, LeadershipLostError)
            leading.join(5)

    made: list[Elector] = []
    monkeypatch.delenv("SPLITBRAIN_CAMPAIGN_TRUTH", raising=False)
    monkeypatch.setattr(kube_worker, "LeaderElector", Elector)
    worker = kube_worker.KubeWorker("default", "c-r26", "w0-1", units=16, prefer=0)
    worker.work_s = 0.3
    shard = ShardConfigMap()
    monkeypatch.setattr(worker, "core", shard)
    monkeypatch.setattr(worker, "leases", shard)
    worker.elect("c-r26-shard-0", 0)
    assert worker.orders.resigned()
    assert made[0].reported == [("shard-0/unit-0", 5299)]
