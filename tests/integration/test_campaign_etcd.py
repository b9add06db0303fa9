"""The etcd campaign, a few seeded runs on a real etcd and a broker of the test session, through
the campaign's driver: the seed's pause and partition make a real zombie and duplicates, each
found, with nothing raised for the ordinary faults and nothing misgraded."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from tests.integration.campaign_election import run_seeded

pytest.importorskip("etcd3gw", reason="the etcd extra is not installed (.[etcd])")

SEED = 1  # run 0: a partition and two pauses past the lease, inside work
RUNS = 2


def test_etcd_zombies_are_found_and_ordinary_faults_raise_nothing(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    run_seeded("etcd", SEED, RUNS, kafka_broker, tmp_path)
