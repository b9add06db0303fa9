"""The emitter refuses what a detector would have to repair: no broker is needed for that."""

import pytest

from detector.contracts.events import EventError
from detector.kafka import emit
from detector.kafka.emit import DeliveryError, Emitter

EVENT = {
    "kind": "heartbeat",
    "workflow_key": "wf",
    "owner_epoch": 3,
    "worker_id": "w1",
}


def test_an_invalid_optional_field_is_an_error_for_the_emitter_s_caller() -> None:
    emitter = Emitter({"bootstrap.servers": "127.0.0.1:9"})
    try:
        with pytest.raises(EventError) as caught:
            emitter.emit(EVENT, lease_duration_s=0)
        assert caught.value.field == "lease_duration_s"
        assert emitter.sent == 0
    finally:
        emitter.close()


class PausedClock:
    """`time` for the emitter's module: a clock that jumps when the process is 'stopped'."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Producer:
    """Stands in for librdkafka's producer: one event in flight, acknowledged by the poll that
    follows the pause (its answer arrived while the process was stopped, unread)."""

    def __init__(self, clock: PausedClock, *, pause_at: int | None, acked_at: int | None) -> None:
        self.clock = clock
        self.pending = 1
        self.polls = 0
        self.pause_at = pause_at
        self.acked_at = acked_at

    def __len__(self) -> int:
        return self.pending

    def poll(self, timeout: float) -> int:
        self.polls += 1
        self.clock.now += timeout
        if self.polls == self.pause_at:
            self.clock.now += 30.0  # SIGSTOP ... SIGCONT, in the middle of the wait
        if self.polls == self.acked_at:
            self.pending = 0
        return 0

    def purge(self) -> None:
        pass

    def close(self) -> None:
        pass


def paused_emitter(
    monkeypatch: pytest.MonkeyPatch, *, pause_at: int | None, acked_at: int | None
) -> tuple[Emitter, Producer]:
    clock = PausedClock()
    monkeypatch.setattr(emit, "time", clock)
    emitter = Emitter({"bootstrap.servers": "127.0.0.1:9"})
    emitter._producer.close()
    producer = Producer(clock, pause_at=pause_at, acked_at=acked_at)
    emitter._producer = producer  # type: ignore[assignment]
    return emitter, producer


def test_a_pause_longer_than_the_flush_does_not_make_acknowledged_events_unacknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process is stopped (SIGSTOP) for 30 s in the middle of a 5 s flush; the broker's
    answer waits, unread, and is served by the next poll: no `DeliveryError`."""
    emitter, producer = paused_emitter(monkeypatch, pause_at=3, acked_at=4)
    emitter.flush(5.0)
    assert producer.polls == 4


def test_the_answer_read_at_the_deadline_still_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    emitter, _ = paused_emitter(monkeypatch, pause_at=None, acked_at=51)
    emitter.flush(5.0)  # 50 polls of 0.1 s, then a last one before deciding


def test_events_never_acknowledged_are_still_reported_after_a_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emitter, producer = paused_emitter(monkeypatch, pause_at=3, acked_at=None)
    with pytest.raises(DeliveryError, match=r"1 event\(s\) not acknowledged within 5s") as error:
        emitter.flush(5.0)
    assert error.value.pending == 1
    # 5 s of polling that could be answered, beside the 30 s the process did not run
    assert 50 <= producer.polls <= 53
