"""The `temporal-activity` campaign, a few seeded runs on Temporal's test server and a broker of the
test session, through the campaign's driver. Seed 39's first run cuts a worker off, then pauses
two past the lease; its second steps two clocks and pauses one: real zombies, every one found,
nothing raised for the ordinary faults, nothing misgraded."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from tests.integration.campaign_temporal import run_seeded

pytest.importorskip("temporalio", reason="the temporal extra is not installed (.[temporal])")


def test_temporal_activity_zombies_are_found_and_ordinary_faults_raise_nothing(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    run_seeded("temporal-activity", 39, 2, kafka_broker, tmp_path)
