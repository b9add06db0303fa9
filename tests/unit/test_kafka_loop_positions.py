"""Where the kafka runtime's stores stand on their changelog: what a partition revoked from a
worker with a standby is kept warm from, learned from its own restore and deliveries."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry

from detector.runtime.checkpoint import Record
from detector.runtime.kafka_loop import KafkaLoopWorker
from detector.runtime.output import Delivered
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.offline import offline_settings

CHANGELOG = "wf.changelog"


@dataclass
class Delivery:
    """The message of a delivery report: where the record landed."""

    part: int
    at: int

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.at


class ReportingOutput:
    """Takes each record at the next offset of its partition; tells the callbacks given."""

    def __init__(self) -> None:
        self.next: dict[int, int] = {0: 40, 1: 7}
        self.reports: list[tuple[Delivered, Delivery]] = []

    def produce(self, record: Record, on_delivery: Delivered | None = None) -> None:
        at = self.next[record.partition]
        self.next[record.partition] = at + 1
        if on_delivery is not None:
            self.reports.append((on_delivery, Delivery(record.partition, at)))


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[KafkaLoopWorker]:
    settings = dataclasses.replace(offline_settings(tmp_path), standby="all")
    w = KafkaLoopWorker(settings, WorkerMetrics(CollectorRegistry()))
    yield w
    w.consumer.close()
    assert w.standby is not None
    w.standby.close()


def states(*partitions: int) -> list[Record]:
    return [Record(CHANGELOG, p, f"wf-{n}".encode(), b"state") for n, p in enumerate(partitions)]


def test_only_each_partition_s_last_state_record_is_reported_and_gives_its_position(
    worker: KafkaLoopWorker,
) -> None:
    output = ReportingOutput()
    worker.output = output  # type: ignore[assignment]
    written = worker._produce_states(states(0, 0, 0, 1, 1))
    assert [d.offset() for _, d in output.reports] == [42, 8]
    for report, delivery in output.reports:
        report(None, delivery)  # type: ignore[arg-type]
    assert written == {0: 43, 1: 9}


def test_a_failed_delivery_gives_no_position(worker: KafkaLoopWorker) -> None:
    output = ReportingOutput()
    worker.output = output  # type: ignore[assignment]
    written = worker._produce_states(states(0))
    ((report, delivery),) = output.reports
    report(KafkaError(KafkaError._MSG_TIMED_OUT), delivery)  # type: ignore[arg-type]
    assert written == {}


def test_a_revoked_partition_is_kept_warm_from_its_own_position_without_asking_the_broker(
    worker: KafkaLoopWorker,
) -> None:
    """The broker's end could hold what a next owner wrote while this worker stalled."""
    worker.partitions = {p: worker._fresh(p) for p in (0, 1)}
    worker.partitions[0].position = 43
    warm = worker._kept_warm([0, 1, 2])  # 2: not this worker's
    assert {p: copy.position for p, copy in warm.items()} == {0: 43, 1: -2}  # 1: from the start
    assert warm[0].store is worker.partitions[0].store
