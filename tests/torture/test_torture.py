"""The shortened torture run of CI: every fault against each runtime, judged by audit.

The long run (100k+ events, 20+ kills) is `scripts/torture.py`; its output is recorded in
docs/decisions/.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from detector.testing.kafka import LocalKafka
from detector.testing.torture.harness import Harness, Plan, run


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    """F4 and F5 kill and pause the broker: this run gets one nobody else uses."""
    broker = LocalKafka(tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


# Faults for a few minutes, then up to `Plan.quiescence_s` (300 s) to settle: above the default.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("runtime", ["kafka", "faust"])
def test_every_fault_is_survived(runtime: str, own_broker: LocalKafka, tmp_path: Path) -> None:
    if runtime == "faust":
        pytest.importorskip("faust", reason="the faust extra is not installed (.[faust])")
    harness = Harness(own_broker.client_config(), tmp_path / "run", runtime=runtime)
    report = run(harness, Plan(events=20_000, kills=5), broker=own_broker)
    print(report.render())
    assert report.faults.keys() >= {
        "F1 SIGKILL",
        "F2 SIGTERM",
        "F3 zombie",
        "F4 broker kill -9",
        "F5 broker SIGSTOP",
        "F6 rebalance",
        "F8 poison",
        "F9 state wiped",
    }
    assert report.missing == []
    assert report.extra == []
    assert report.duplicate_revisions == []
    assert report.mismatched == [], report.differences
    assert report.lagging_partitions == []
    assert report.open_transactions == []
    assert report.dlq_problems == []
