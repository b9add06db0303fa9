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


def test_a_commit_blocked_past_give_up_s_ends_the_worker_once_it_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A group coordinator lost for good: librdkafka waits inside the commit for ever, so the
    worker gives up and a fresh process looks the coordinator up again."""
    clock = Clock()
    ended: list[float] = []
    watch = StallWatch(after_s=30.0, clock=clock, give_up_s=300.0, give_up=lambda: ended.append(1))
    watch.kafka_error("GroupCoordinator: 127.0.0.1:9093/2: Connection refused")
    watch.committing(True)
    clock.now += 299.0
    watch.check(assigned=True)
    assert ended == []
    assert "stalled on Kafka" in caplog.messages[-1]
    clock.now += 1.0
    watch.check(assigned=True)
    assert ended == [1]
    assert caplog.messages[-1].startswith("giving up: a commit has waited 300 s for Kafka")
    assert "Connection refused" in caplog.messages[-1]


def test_a_long_outage_between_commits_is_waited_out_and_a_worker_may_never_give_up() -> None:
    """Only a commit that waits counts: a worker that commits now and then keeps going, and with
    no give_up_s (`--commit-give-up-s 0`) even a blocked commit is waited for."""
    clock = Clock()
    ended: list[int] = []
    watch = StallWatch(clock=clock, give_up_s=300.0, give_up=lambda: ended.append(1))
    for _ in range(10):
        watch.committing(True)
        clock.now += 200.0
        watch.check(assigned=True)
        watch.committing(False)
        watch.progressed()
    never = StallWatch(clock=clock, give_up_s=None, give_up=lambda: ended.append(2))
    never.committing(True)
    clock.now += 10_000.0
    never.check(assigned=True)
    assert ended == []


def test_a_commit_past_its_timeout_while_the_cluster_serves_ends_the_worker_after_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A single broker restarted and serving again, yet librdkafka still waits inside the commit
    (#5456): the worker ends once the cluster has served for the grace, not at give_up_s."""
    clock = Clock()
    ended: list[int] = []
    serving = [False]
    watch = StallWatch(
        after_s=30.0,
        clock=clock,
        give_up_s=300.0,
        give_up=lambda: ended.append(1),
        serving=lambda: serving[0],
        serving_grace_s=20.0,
    )
    watch.committing(True)
    clock.now += 60.0  # the broker is down: waited for
    watch.check(assigned=True)
    assert ended == []
    serving[0] = True
    watch.check(assigned=True)  # serving from now
    clock.now += 15.0
    serving[0] = False  # a blip: the grace starts again
    watch.check(assigned=True)
    serving[0] = True
    watch.check(assigned=True)
    clock.now += 19.0
    watch.check(assigned=True)
    assert ended == []
    clock.now += 1.0
    watch.check(assigned=True)
    assert ended == [1]
    assert "past its own 30 s timeout although the cluster has served" in caplog.messages[-1]
    assert "for 20 s" in caplog.messages[-1]


def test_a_commit_in_time_never_asks_the_cluster_and_never_gives_up_when_told_not_to() -> None:
    """Within its timeout a commit is not probed; `--commit-give-up-s 0` waits even for a
    client that lost its coordinator."""
    clock = Clock()
    asked: list[int] = []
    ended: list[int] = []

    def serving() -> bool:
        asked.append(1)
        return True

    watch = StallWatch(
        clock=clock, give_up_s=300.0, give_up=lambda: ended.append(1), serving=serving
    )
    watch.committing(True)
    clock.now += 29.0
    watch.check(assigned=True)
    assert asked == []
    never = StallWatch(
        clock=clock, give_up_s=None, give_up=lambda: ended.append(2), serving=serving
    )
    never.committing(True)
    clock.now += 1000.0
    never.check(assigned=True)
    assert ended == []
