"""The worker says once when it stalls on Kafka, naming the cause, and says when it resumes."""

import logging

import pytest

from detector.runtime.stall import StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stall_with_kafka_errors_is_said_once_and_its_end_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    watch = StallWatch(after_s=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger="detector.runtime.stall")
    watch.kafka_error("Connect to 127.0.0.1:9092 failed: Connection refused")
    clock.now += 29.0
    watch.check(assigned=False)
    assert caplog.messages == []
    clock.now += 2.0
    watch.check(assigned=False)
    watch.check(assigned=False)
    (warning,) = caplog.messages
    assert "nothing committed for 31 s" in warning
    assert "the group coordinator or the changelog is unreachable" in warning
    assert "Connection refused" in warning
    clock.now += 10.0
    watch.progressed()
    assert caplog.messages[-1] == "resumed: committing again after 41 s stalled"


def test_no_progress_without_a_kafka_error_is_no_stall(caplog: pytest.LogCaptureFixture) -> None:
    """A standby worker (no partition) or an idle one waits for nothing."""
    clock = Clock()
    watch = StallWatch(after_s=30.0, clock=clock)
    watch.kafka_error("NOT_ENOUGH_REPLICAS")
    watch.progressed()
    clock.now += 300.0
    watch.check(assigned=True)
    assert caplog.messages == []


def test_a_commit_blocked_on_kafka_is_a_stall_even_with_no_error_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two brokers of three down: the transaction call itself waits, and reports nothing."""
    clock = Clock()
    watch = StallWatch(after_s=30.0, clock=clock)
    watch.committing(True)
    clock.now += 31.0
    watch.check(assigned=True)
    (warning,) = caplog.messages
    assert "a commit has waited for Kafka all along" in warning
    assert "last error: none reported" in warning
