"""The LangGraph campaign, a seeded run: pods on a real PostgreSQL resuming interrupted threads
through PostgresSaver and the adapter, a pod paused inside its work node until another pod
resumed the same checkpoint and wrote the same reply (an aimed pause, `campaign.aim`), and a
real `splitbrain worker` whose findings are matched against LangGraph's own checkpoint table
(two children of one checkpoint)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import psycopg
import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.driver import campaign
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.truth import TruthLog

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")

from detector.adapters.langgraph import fork_effect_key
from detector.testing.campaign.langgraph_worker import recover
from detector.testing.campaign.sources.langgraph import setup, source

# Seed 6's schedule pauses pod 1 twice and crashes pod 0. The pauses are aimed, so the first
# makes a zombie whatever the machine's load: a pause left to land wherever its pod was made
# none in two full CI runs of four.
SEED = 6


def test_the_findings_match_langgraphs_checkpoints_under_pauses_crashes_and_retries(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    langgraph = dataclasses.replace(
        source(),
        faults=frozenset(
            {Fault.PAUSE_PAST_LEASE, Fault.CRASH_RESTART, Fault.EXCEPTION_RETRY, Fault.PARTITION}
        ),
        threads=12,
        span_s=6.0,
        steps=3,
        aimed=True,
    )
    outcome = campaign(
        langgraph, runs=1, seed=SEED, workdir=tmp_path, bootstrap=kafka_broker.bootstrap
    )
    v = outcome.verdict
    assert (v.false_positives, v.false_negatives, v.misgraded) == (0, 0, 0), v.notes
    # The paused pod's reply landed after a later claim's child of its checkpoint, and was found.
    writes = list(TruthLog(tmp_path / "run-000" / "truth.jsonl").writes())
    assert any(not w.owned and w.effect_key.startswith("reply/") for w in writes), writes
    assert v.true_positives >= 1
    assert not outcome.undrained_runs


def test_a_write_whose_pod_died_before_recording_it_is_recovered_from_postgresql(
    empty_postgres_dsn: str, tmp_path: Path
) -> None:
    """A pod killed between a write and its record: a reply from its row, a first child of a
    base from the adapter's ledger (a false alarm in a CI run: the detector heard both children
    of a base, the truth had one)."""
    dsn = empty_postgres_dsn
    setup(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO campaign_jobs (run, thread_id, base, think_s, slot)"
            " VALUES (0, 't-1', 'b-1', 1, 0), (1, 't-2', 'b-2', 1, 0)"
        )
        conn.execute(
            "INSERT INTO langgraph_children"
            " (thread_id, checkpoint_ns, parent_id, child_id, epoch, worker_id, seq)"
            " VALUES ('t-1', '', 'b-1', 'c-1', 1, 'pod-0', 2),"
            " ('t-2', '', 'b-2', 'c-2', 1, 'pod-0', 2)"
        )
        conn.execute(
            "INSERT INTO campaign_effects (thread_id, effect_key, claim, worker, epoch, owned)"
            " VALUES ('t-1', 'reply/t-1', 2, 'pod-2', 2, true),"
            " ('t-1', 'reply/t-1', 1, 'pod-1', 1, false),"
            " ('t-1', 'reply/t-1', 3, 'pod-0', NULL, true)"
        )
    truth = TruthLog(tmp_path / "truth.jsonl", run=0)
    truth.record(
        workflow_key="t-1",
        effect_key="reply/t-1",
        executor="pod-2",
        epoch=2,
        owned=True,
        evidence="",
    )
    assert recover(dsn, truth) == 3
    assert recover(dsn, truth) == 0  # each write once
    assert {(w.effect_key, w.executor, w.epoch, w.owned, w.blind) for w in truth.writes()} == {
        ("reply/t-1", "pod-2", 2, True, None),
        (fork_effect_key("b-1"), "pod-0", 1, True, None),
        ("reply/t-1", "pod-1", 1, False, None),
        ("reply/t-1", "pod-0", 0, True, "unwatched_run"),
    }
