"""The kafka runtime after a failed transaction, with no broker: which failures it goes on from
with the same producer, and which with a new one.

The CI stall (2026-12-05): after a broker's kill -9, a worker's `AddOffsetsToTxn` timed out 14
times in a row, each transaction aborted cleanly and the next one sent to the same lost
coordinator (librdkafka #5456, #5511). A new producer looks its coordinators up afresh, and its
`init_transactions` ends whatever the old one left open.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry

from detector.runtime.checkpoint import Record
from detector.runtime.kafka_loop import FencedError, KafkaLoopWorker
from detector.runtime.output import Delivered
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.offline import offline_settings

TIMED_OUT = KafkaException(KafkaError(KafkaError._TIMED_OUT, "AddOffsetsToTxn timed out"))
REFUSED = KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, "not the coordinator"))
FENCED = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance"))


class RecordedOutput:
    """An output that records what the worker asks of it."""

    commits_on_revoke = False

    def __init__(self, *, renews_after_timeout: bool, abort_fails: KafkaException | None) -> None:
        self.renews_after_timeout = renews_after_timeout
        self.abort_fails = abort_fails
        self.calls: list[str] = []

    def produce(self, record: Record, on_delivery: Delivered | None = None) -> None:
        self.calls.append("produce")

    def start(self) -> None:
        self.calls.append("start")

    def begin(self) -> None:
        self.calls.append("begin")

    def deliver(self) -> None:
        self.calls.append("deliver")

    def commit(self, offsets: list[TopicPartition]) -> None:
        self.calls.append("commit")

    def abort(self) -> None:
        self.calls.append("abort")
        if self.abort_fails is not None:
            raise self.abort_fails

    def renew(self, *, fenced: bool) -> bool:
        self.calls.append("renew, fenced" if fenced else "renew")
        # What the two outputs answer while the transaction is younger than its timeout.
        return self.renews_after_timeout and not fenced


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[KafkaLoopWorker]:
    w = KafkaLoopWorker(offline_settings(tmp_path), WorkerMetrics(CollectorRegistry()))
    yield w
    w.consumer.close()


def failed(
    worker: KafkaLoopWorker,
    exc: KafkaException,
    *,
    transactional: bool = True,
    abort_fails: KafkaException | None = None,
) -> list[str]:
    """What the output was asked, from the batch's start to the worker going on after `exc`."""
    output = RecordedOutput(renews_after_timeout=transactional, abort_fails=abort_fails)
    worker.output = output
    worker._begin()
    worker._recover(exc)
    return output.calls


def test_a_transaction_that_timed_out_is_followed_by_a_new_producer(
    worker: KafkaLoopWorker,
) -> None:
    assert failed(worker, TIMED_OUT) == ["begin", "abort", "renew", "start"]
    assert worker.checkpoint.opened_at is None  # the next batch opens a new transaction


def test_a_broker_s_refusal_is_retried_with_the_same_producer(worker: KafkaLoopWorker) -> None:
    assert failed(worker, REFUSED) == ["begin", "abort"]


def test_at_least_once_a_timeout_is_retried_with_the_same_producer(
    worker: KafkaLoopWorker,
) -> None:
    """Its producer has no coordinator to lose, and a new one could not end anything."""
    assert failed(worker, TIMED_OUT, transactional=False) == ["begin", "abort"]


def test_an_abort_that_times_out_too_gets_one_new_producer(worker: KafkaLoopWorker) -> None:
    assert failed(worker, TIMED_OUT, abort_fails=TIMED_OUT) == ["begin", "abort", "renew", "start"]


def test_a_worker_fenced_by_a_newer_instance_stops(worker: KafkaLoopWorker) -> None:
    with pytest.raises(FencedError):
        failed(worker, FENCED)
