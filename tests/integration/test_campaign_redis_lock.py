"""The redis-lock campaign, seeded runs on Debian's `redis-server` and a broker of the test
session, through the campaign's driver: the seed's pauses and partition outlive the locks'
timeout inside work, so displaced holders write after a successor took the lock (the fence
counter, read in the write's own script, says so); each is found, with nothing raised for the
ordinary faults and nothing misgraded. A holder's write heard after the next acquisition (no
seq: its holder paused, or stopped, just after it) is counted blind (`heard_late`), and so is a
displaced holder's write that may be heard before the takeover (`heard_early`) when no finding
names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from tests.integration.campaign_election import run_seeded

pytest.importorskip("redis", reason="the redis-lock extra is not installed (.[redis-lock])")

SEED = 1  # run 0: a partition and two pauses past the lock's timeout, inside work
RUNS = 2


def test_redis_lock_zombies_are_found_and_ordinary_faults_raise_nothing(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    run_seeded("redis-lock", SEED, RUNS, kafka_broker, tmp_path)
