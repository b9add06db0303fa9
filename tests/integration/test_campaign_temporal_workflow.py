"""The `temporal-workflow` campaign, a few seeded runs on Temporal's test server and a broker of the
test session, through the campaign's driver: the seeds' pauses make real zombies, and every one
is found, with nothing raised for the ordinary faults and nothing misgraded."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from tests.integration.campaign_temporal import run_seeded

pytest.importorskip("temporalio", reason="the temporal extra is not installed (.[temporal])")


def test_temporal_workflow_zombies_are_found_and_ordinary_faults_raise_nothing(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    run_seeded("temporal-workflow", SEED, RUNS, kafka_broker, tmp_path)
