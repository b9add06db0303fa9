"""The Kubernetes campaign, a few seeded runs on a real kube-apiserver and a broker of the test
session, through the campaign's driver: the seed's partition past the Lease makes a real zombie,
found, with nothing raised for the ordinary faults and nothing misgraded.

Marked `slow`: it needs the built server (skipped, naming the command, when it is not there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.sources import load
from tests.integration.campaign_election import run_seeded

pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")

pytestmark = pytest.mark.slow

SEED = 1  # run 1: a worker cut off from the API server past its Lease, inside work
RUNS = 2


def test_kubernetes_zombies_are_found_and_ordinary_faults_raise_nothing(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    missing = load("kubernetes").missing()
    if missing is not None:
        pytest.skip(missing)
    run_seeded("kubernetes", SEED, RUNS, kafka_broker, tmp_path)
