"""The lease store's campaign, two seeded runs through the campaign's driver: a real PostgreSQL,
the outbox relay, three workers under the nemesis and a detector worker, on the session's broker.

Seed 1's first run (unfenced) pauses two workers inside their tool calls past their leases: they
wake and commit after a takeover. Its second (fenced) cancels a running job and partitions a
worker from the store: their late effects are refused. Every stale write and duplicate the
ground truth holds must be found, graded as DESIGN says for a source with `seq` and destination
receipts, and nothing else raised.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.testing.campaign.driver import campaign
from detector.testing.campaign.sources.leases import source


def test_seeded_runs_find_every_zombie_and_raise_nothing_else(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    leases = source()
    missing = leases.missing()
    if missing is not None:
        pytest.skip(missing)
    result = campaign(
        leases, runs=2, seed=1, workdir=tmp_path, bootstrap=kafka_broker.bootstrap, say=print
    )
    v = result.verdict
    assert (v.false_positives, v.false_negatives, v.misgraded) == (0, 0, 0), v.notes
    assert v.true_positives >= 1
    assert result.undrained_runs == []
