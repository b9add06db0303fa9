"""What the etcd, Kubernetes, redis-lock and kafka-consumer campaign tests share: a few seeded
runs of a source through the campaign's driver on the test session's broker, and the verdict
they must get."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.driver import campaign
from detector.testing.campaign.sources import load


def run_seeded(name: str, seed: int, runs: int, broker: LocalKafka, workdir: Path) -> None:
    """Skipped when the source cannot run here (a package or its server missing). Every stale
    write and duplicate the runs made is found, nothing is raised for the ordinary faults,
    nothing is misgraded, and the seed made at least one zombie."""
    source = load(name)
    missing = source.missing()
    if missing is not None:
        pytest.skip(missing)
    outcome = campaign(
        source, runs=runs, seed=seed, workdir=workdir, bootstrap=broker.bootstrap, say=print
    )
    verdict = outcome.verdict
    assert not outcome.undrained_runs, outcome
    assert verdict.false_positives == 0, verdict.notes
    assert verdict.false_negatives == 0, verdict.notes
    assert verdict.misgraded == 0, verdict.notes
    assert verdict.true_positives >= 1, verdict
