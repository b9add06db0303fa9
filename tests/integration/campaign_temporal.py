"""What the Temporal campaign tests share: seeded runs through the driver, and the verdict they
must reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.driver import campaign
from detector.testing.campaign.sources import load


def run_seeded(name: str, seed: int, runs: int, broker: LocalKafka, workdir: Path) -> None:
    """`runs` runs of `name` from `seed`: at least one zombie found, no false alarm, no miss,
    nothing misgraded, every run's work done."""
    source = load(name)
    missing = source.missing()
    if missing is not None:
        pytest.skip(missing)
    outcome = campaign(source, runs=runs, seed=seed, workdir=workdir, bootstrap=broker.bootstrap)
    v = outcome.verdict
    assert (v.false_positives, v.false_negatives, v.misgraded) == (0, 0, 0), v.notes
    assert v.true_positives >= 1, outcome
    assert not outcome.undrained_runs, outcome
