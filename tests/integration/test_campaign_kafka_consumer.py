"""The kafka-consumer campaign, a seeded run on a broker of the test session (the group's
coordinator) and Debian's `redis-server` (the ledger), through the campaign's driver: the seed's
member paused past its session finishes its record after the group gave its partition to another
member, which processed the record again (the group's assignment, read in the write's own
script, says so); each such write is found, the handoffs and the shutdown raise nothing, and
nothing is misgraded."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from tests.integration.campaign_election import run_seeded

pytest.importorskip("redis", reason="the ledger needs redis-py (.[redis-lock])")

SEED = 3  # run 0: worker 0 paused 9.8 s inside its work; run 1: a handoff and two crashes
RUNS = 2


def test_kafka_consumer_zombies_are_found_and_ordinary_faults_raise_nothing(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    run_seeded("kafka-consumer", SEED, RUNS, kafka_broker, tmp_path)
