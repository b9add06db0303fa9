"""The LangGraph campaign, a few seeded runs: pods on a real PostgreSQL resuming interrupted
threads through PostgresSaver and the adapter, a pod paused inside its work node past its claim
while another resumes the same checkpoint, and a real `splitbrain worker` whose findings are
matched against LangGraph's own checkpoint table (two children of one checkpoint)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.driver import campaign
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.truth import TruthLog

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")

from detector.testing.campaign.sources.langgraph import source

# Seed 6's schedule pauses pod 1 inside its work node past its claim twice and crashes pod 0:
# the paused pod's effects land after the next pod resumed the same checkpoint.
SEED = 6


# In the slow job: in two of the last four full CI runs (two xdist workers beside it) the seed
# made no zombie: a pause lands wherever its pod is, and the next pod must take the claim and
# write before it resumes (docs/campaign.md).
@pytest.mark.slow
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
    )
    outcome = campaign(
        langgraph, runs=1, seed=SEED, workdir=tmp_path, bootstrap=kafka_broker.bootstrap
    )
    v = outcome.verdict
    assert (v.false_positives, v.false_negatives, v.misgraded) == (0, 0, 0), v.notes
    # A zombie really wrote: an effect after a later claim's child of its checkpoint, found.
    writes = list(TruthLog(tmp_path / "run-000" / "truth.jsonl").writes())
    assert any(not w.owned for w in writes)
    assert v.true_positives >= 1
    assert not outcome.undrained_runs
