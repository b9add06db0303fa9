"""The adapters' sink and ownership context: the host's code never waits for or sees a failure
of ours, and what cannot be published is counted by reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from detector.adapters import (
    AdapterSink,
    Authority,
    DropReason,
    Ownership,
    current,
    effect_committed,
    effect_rejected,
    owning,
)
from detector.contracts.events import Kind, OwnershipEvent, Source, parse_event_json
from detector.kafka.emit import Emitter


class Recorder:
    """Stands in for the emitter: keeps what it was given, can be made to fail or to block."""

    def __init__(self, *, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.events: list[OwnershipEvent] = []
        self.fail = fail
        self.gate = gate

    def publish(self, event: OwnershipEvent, value: bytes) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise RuntimeError("broker gone")
        assert parse_event_json(value) == event  # the bytes sent say what was validated
        self.events.append(event)

    def flush(self, timeout: float = 0) -> None:
        pass

    def close(self) -> None:
        pass


def dropped(registry: CollectorRegistry, reason: DropReason) -> float:
    value = registry.get_sample_value(
        "splitbrain_adapter_events_dropped_total", {"adapter": "test", "reason": reason.value}
    )
    return value or 0.0


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def sink(registry: CollectorRegistry, recorder: Recorder) -> Iterator[AdapterSink]:
    s = AdapterSink("test", publisher=lambda: recorder, registry=registry)
    yield s
    s.close()


def owner(sink: AdapterSink, authority: Authority = Authority.SYSTEM) -> Ownership:
    return Ownership(sink, "ns/wf/run/act", 3, "worker-a", authority, "test.attempt")


def test_effect_calls_inside_an_ownership_carry_its_key_epoch_and_authority(
    sink: AdapterSink, recorder: Recorder
) -> None:
    with owning(owner(sink)) as own:
        assert current() is own
        own.acquired()
        assert effect_committed("charge/o1", destination="payments")
    assert current() is None
    assert sink.flush()
    acquired, committed = recorder.events
    assert acquired.kind is Kind.LEASE_ACQUIRED and acquired.source is Source.COORDINATOR
    assert (committed.workflow_key, committed.owner_epoch, committed.effect_key) == (
        "ns/wf/run/act",
        3,
        "charge/o1",
    )
    assert committed.source is Source.WORKER  # a worker's word, not the destination's
    assert committed.attrs == {"epoch_authority": "system", "epoch_from": "test.attempt"}


def test_a_minted_epoch_never_claims_the_coordinators_authority(
    sink: AdapterSink, recorder: Recorder
) -> None:
    owner(sink, Authority.MINTED).acquired()
    assert sink.flush()
    assert recorder.events[0].source is Source.WORKER
    assert recorder.events[0].attrs == {"epoch_authority": "minted", "epoch_from": "test.attempt"}


def test_outside_an_ownership_effect_calls_emit_nothing(
    sink: AdapterSink, recorder: Recorder
) -> None:
    assert not effect_committed("charge/o1")
    assert not effect_rejected("charge/o1")
    assert sink.flush()
    assert recorder.events == []


def test_an_ownership_does_not_leak_into_another_thread_s_task(sink: AdapterSink) -> None:
    seen: list[Ownership | None] = []
    with owning(owner(sink)):
        t = threading.Thread(target=lambda: seen.append(current()))
        t.start()
        t.join()
    assert seen == [None]


def test_a_failing_broker_is_counted_never_raised(registry: CollectorRegistry) -> None:
    sink = AdapterSink("test", publisher=lambda: Recorder(fail=True), registry=registry)
    try:
        with owning(owner(sink)):
            assert effect_committed("charge/o1")
        assert sink.flush()
        assert dropped(registry, DropReason.KAFKA) == 1
    finally:
        sink.close()


def test_a_producer_that_cannot_be_made_is_counted(registry: CollectorRegistry) -> None:
    def broken() -> Recorder:
        raise RuntimeError("bad configuration")

    sink = AdapterSink("test", publisher=broken, registry=registry)
    try:
        owner(sink).acquired()
        assert sink.flush()
        assert dropped(registry, DropReason.KAFKA) == 1
    finally:
        sink.close()


def test_an_invalid_event_is_dropped_and_counted(
    sink: AdapterSink, recorder: Recorder, registry: CollectorRegistry
) -> None:
    sink.send(Kind.HEARTBEAT, workflow_key="wf", owner_epoch=-1, worker_id="w")
    sink.send(Kind.HEARTBEAT, workflow_key="wf", owner_epoch=1, worker_id="w")
    assert sink.flush()
    assert dropped(registry, DropReason.INVALID) == 1
    assert [e.owner_epoch for e in recorder.events] == [1]


def test_a_stalled_broker_fills_the_queue_then_drops_without_blocking_the_host(
    registry: CollectorRegistry,
) -> None:
    gate = threading.Event()
    sink = AdapterSink(
        "test", publisher=lambda: Recorder(gate=gate), capacity=10, registry=registry
    )
    try:
        own = owner(sink)
        for _ in range(50):
            own.emit(Kind.HEARTBEAT)  # returns at once while the publisher is stuck
        assert dropped(registry, DropReason.QUEUE_FULL) >= 39
        gate.set()
        assert sink.flush()
    finally:
        sink.close()


def test_an_unreachable_kafka_buffers_and_the_host_goes_on(registry: CollectorRegistry) -> None:
    """The real emitter against a port where nothing listens: events wait in its buffer."""
    sink = AdapterSink(
        "test",
        publisher=lambda: Emitter({"bootstrap.servers": "127.0.0.1:9"}),
        capacity=100,
        registry=registry,
    )
    own = owner(sink)
    for _ in range(1000):
        own.emit(Kind.HEARTBEAT)
    sink.close(timeout=10.0)
    # Nothing reached Kafka, and every event is counted: queue full, or discarded at close.
    assert sum(dropped(registry, r) for r in DropReason) == 1000
    assert dropped(registry, DropReason.QUEUE_FULL) > 0
    own.emit(Kind.HEARTBEAT)
    assert dropped(registry, DropReason.CLOSED) > 0
