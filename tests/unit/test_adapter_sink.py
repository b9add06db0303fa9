"""The adapters' sink and ownership context: the host's code never waits for or sees a failure
of ours, and what cannot be published is counted by reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

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

    def publish_json(self, workflow_key: str, value: bytes) -> None:
        """How the sink hands over every event: each must be valid by the contract as sent,
        whether the sink validated it in full or took it from an adapter's owner."""
        event = parse_event_json(value)
        assert event.workflow_key == workflow_key
        assert not event.dropped_fields
        self.publish(event, value)

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


def test_adapter_built_events_are_valid_by_the_contract_as_sent(
    sink: AdapterSink, recorder: Recorder
) -> None:
    """Every field an adapter may give its owner's events, on the path that skips the full
    validation: the recorder reads each with the contract's validator."""
    own = owner(sink, Authority.APPROXIMATE)
    own.acquired(
        seq=0,
        lease_duration_s=30.0,
        heartbeat_interval_s=5.0,
        lease_until=datetime(2026, 12, 2, tzinfo=UTC),
        detail={"attempt": 2, "state": "SUCCESS", "ratio": 0.5, "retried": False, "none": None},
    )
    own.emit(Kind.HEARTBEAT, seq=2**63 - 1)
    own.emit(
        Kind.EFFECT_COMMITTED,
        event_id="fork-1",
        effect_key="checkpoint-child/p",
        destination="",
        source=Source.DESTINATION,
    )
    own.emit(Kind.EFFECT_REJECTED, destination="db")
    own.emit(Kind.LEASE_RELEASED, detail={"state": "ü" * 500})
    assert sink.flush()
    acquired, beat, committed, rejected, released = recorder.events
    assert acquired.source is Source.WORKER and acquired.lease_duration_s == 30.0
    assert acquired.detail == {
        "attempt": 2,
        "state": "SUCCESS",
        "ratio": 0.5,
        "retried": False,
        "none": None,
    }
    assert acquired.attrs == {"epoch_authority": "approximate", "epoch_from": "test.attempt"}
    assert beat.seq == 2**63 - 1
    assert (committed.event_id, committed.source) == ("fork-1", Source.DESTINATION)
    assert rejected.effect_key == "result"  # the contract's default for a rejection
    assert released.detail == {"state": "ü" * 500}
    assert len({e.event_id for e in recorder.events}) == 5


def test_fields_that_break_the_contract_are_validated_in_full(
    sink: AdapterSink, recorder: Recorder, registry: CollectorRegistry
) -> None:
    """As any input: a bad required field costs the event (counted), a bad optional one is
    left out of the event sent."""
    Ownership(sink, "k" * 513, 1, "w", Authority.MINTED, "test").acquired()
    Ownership(sink, "k", 1, "w", Authority.MINTED, "test", {"a": "v" * 129}).acquired()
    own = owner(sink)
    own.emit(Kind.EFFECT_COMMITTED)  # no effect key
    own.emit(Kind.HEARTBEAT, seq=-1)
    own.emit(Kind.HEARTBEAT, seq=1)
    assert sink.flush()
    assert dropped(registry, DropReason.INVALID) == 2
    no_attrs, no_seq, beat = recorder.events
    assert (no_attrs.workflow_key, no_attrs.attrs) == ("k", None)
    assert (no_seq.seq, beat.seq) == (None, 1)


def test_what_the_cheap_check_cannot_tell_is_validated_in_full(
    sink: AdapterSink, recorder: Recorder, registry: CollectorRegistry
) -> None:
    """A nested or long `detail` takes the contract's validator: kept when it fits, dropped
    from the event (which is sent) when it does not."""
    own = owner(sink)
    own.emit(Kind.PROGRESS, detail={"nested": {"step": [1, 2]}})
    own.emit(Kind.PROGRESS, detail={"big": "x" * 5000})
    assert sink.flush()
    nested, big = recorder.events
    assert nested.detail == {"nested": {"step": [1, 2]}}
    assert big.detail is None
    assert dropped(registry, DropReason.INVALID) == 0


def test_events_queued_while_the_sender_lingers_are_all_sent_in_order(
    registry: CollectorRegistry, recorder: Recorder
) -> None:
    sink = AdapterSink("test", publisher=lambda: recorder, registry=registry, linger_s=0.05)
    try:
        own = owner(sink)
        for seq in range(500):
            own.emit(Kind.HEARTBEAT, seq=seq)
        assert sink.flush()
        assert [e.seq for e in recorder.events] == list(range(500))
    finally:
        sink.close()


def test_a_linger_outside_its_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="linger_s"):
        AdapterSink("test", linger_s=2.0)
