"""The Celery campaign, a seeded run or two, against Debian's `redis-server`, three real Celery
workers and a real `splitbrain worker`: the seeds' paused workers outlive the visibility timeout
and charge again after the redelivery did (the ground truth, read in Redis at each charge, says
so); every such zombie is found, and nothing else is raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.driver import campaign
from detector.testing.campaign.sources import load
from tests.tools import program

pytest.importorskip("celery", reason="the celery extra is not installed (.[celery])")

# Seed 1's run 0 pauses worker 1 inside its tasks twice past the visibility timeout.
SEED = 1
RUNS = 1


def test_the_celery_campaign_finds_its_zombies_and_raises_nothing_else(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    program("redis-server", package="redis-server")
    outcome = campaign(
        load("celery"),
        runs=RUNS,
        seed=SEED,
        workdir=tmp_path,
        bootstrap=kafka_broker.bootstrap,
        say=lambda _: None,
    )
    v = outcome.verdict
    assert outcome.undrained_runs == []
    assert v.true_positives >= 1, v.notes
    assert (v.false_positives, v.false_negatives, v.misgraded) == (0, 0, 0), v.notes
