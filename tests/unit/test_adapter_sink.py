"""The adapters' sink and ownership context: the host's code never waits for or sees a failure
of ours, and what cannot be published is counted by reason."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detector.adapters import (
    AdapterSink,
    Authority,
    DropReason,
    Ownership,
    _sink,
    current,
    effect_committed,
    effect_rejected,
    owning,
)
from detector.adapters._sink import _flush_at_exit
from detector.contracts.events import Kind, OwnershipEvent, Source, parse_event_json
from detector.kafka.emit import DeliveryError, Emitter


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


def test_an_unreachable_kafka_buffers_and_the_host_goes_on(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """The real emitter against a port where nothing listens: events wait in its buffer, and
    what the close lets go is counted and said."""
    sink = AdapterSink(
        "test",
        publisher=lambda: Emitter({"bootstrap.servers": "127.0.0.1:9"}),
        capacity=100,
        registry=registry,
    )
    own = owner(sink)
    for _ in range(1000):
        own.emit(Kind.HEARTBEAT)
    with caplog.at_level(logging.WARNING):
        sink.close(timeout=10.0)
    # Nothing reached Kafka, and every event is counted: queue full, or discarded at close.
    assert sum(dropped(registry, r) for r in DropReason) == 1000
    assert dropped(registry, DropReason.QUEUE_FULL) > 0
    said = [r.getMessage() for r in caplog.records if "at close" in r.getMessage()]
    assert said and all("counted as dropped (reason closed)" in line for line in said), said
    own.emit(Kind.HEARTBEAT)
    assert dropped(registry, DropReason.CLOSED) > 0


def late_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "after its sink was closed" in r.getMessage()]


def test_events_sent_to_a_closed_sink_are_said_without_flooding(
    registry: CollectorRegistry,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Work that outlived its sink (a stale write's `effect_committed`) must show in the log,
    not only in the metric: the first drop at once, later ones summed, the rest at exit."""
    sink = AdapterSink("test", publisher=lambda: recorder, registry=registry)
    own = owner(sink)
    own.emit(Kind.HEARTBEAT)
    sink.close()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            own.effect(Kind.EFFECT_COMMITTED, "charge/42", Source.DESTINATION, None, None, None)
        assert dropped(registry, DropReason.CLOSED) == 3
        (first,) = late_lines(caplog)
        assert first.startswith("adapter test: 1 event(s) sent after its sink was closed")
        assert "reason closed" in first and "charge/42" not in first
        monkeypatch.setattr(_sink, "_LATE_LOG_EVERY_S", 0.0)
        own.emit(Kind.HEARTBEAT)  # the interval passed: the two unsaid and this one
        assert late_lines(caplog)[1].startswith("adapter test: 3 event(s)")
        monkeypatch.setattr(_sink, "_LATE_LOG_EVERY_S", 60.0)
        own.emit(Kind.HEARTBEAT)
        assert len(late_lines(caplog)) == 2
        _flush_at_exit([sink])
        assert late_lines(caplog)[2].startswith("adapter test: 1 event(s)")
        _flush_at_exit([sink])  # nothing new: nothing said
    assert len(late_lines(caplog)) == 3
    assert dropped(registry, DropReason.CLOSED) == 5


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


# ---- the process's exit: flushed within a bound, the rest counted and logged --------------------


class Unacknowledging(Recorder):
    """Takes every event and never gets Kafka's acknowledgement, as the emitter against a
    broker that does not answer: `flush` waits its timeout, then says how many are left."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes: list[float] = []

    def flush(self, timeout: float = 0) -> None:
        self.flushes.append(timeout)
        time.sleep(timeout)  # the real one polls this long
        raise DeliveryError("not acknowledged", [], len(self.events))

    def unacknowledged(self) -> int:
        return len(self.events)


def exit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "at exit" in r.getMessage()]


def test_at_exit_every_queued_event_is_sent_and_the_sink_closes(
    registry: CollectorRegistry, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    sink = AdapterSink("test", publisher=lambda: recorder, registry=registry, exit_flush_s=5)
    own = owner(sink)
    for seq in range(200):
        own.emit(Kind.HEARTBEAT, seq=seq)
    _flush_at_exit([sink])
    assert [e.seq for e in recorder.events] == list(range(200))
    assert dropped(registry, DropReason.EXIT) == 0
    assert exit_lines(caplog) == []
    own.emit(Kind.HEARTBEAT)  # the host's code still running at exit: counted, not queued
    assert dropped(registry, DropReason.EXIT) == 1
    assert sink.queued == 0


def test_at_exit_a_stalled_producer_costs_the_bound_and_its_events_are_counted(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """The sender is stuck handing the first event over: the exit waits its bound, no more, and
    counts every event, the one in the sender's hand too, in one line without their content."""
    gate = threading.Event()
    sink = AdapterSink(
        "test", publisher=lambda: Recorder(gate=gate), registry=registry, exit_flush_s=0.3
    )
    try:
        own = owner(sink)
        for _ in range(5):
            own.emit(Kind.HEARTBEAT)
        started = time.monotonic()
        _flush_at_exit([sink])
        assert time.monotonic() - started < 0.3 + 0.5
        assert dropped(registry, DropReason.EXIT) == 5
        (line,) = exit_lines(caplog)
        assert line == (
            "adapter test: 5 event(s) not sent at exit: Kafka did not take them within 0.3s "
            "(SPLITBRAIN_ADAPTER_EXIT_FLUSH_S); counted as dropped, reason exit"
        )
    finally:
        gate.set()


def test_at_exit_what_kafka_did_not_acknowledge_is_counted_once(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    publisher = Unacknowledging()
    sink = AdapterSink("test", publisher=lambda: publisher, registry=registry, exit_flush_s=0.5)
    own = owner(sink)
    for _ in range(3):
        own.emit(Kind.HEARTBEAT)
    started = time.monotonic()
    _flush_at_exit([sink])
    assert time.monotonic() - started < 0.5 + 0.5
    assert len(publisher.events) == 3
    assert all(timeout <= 0.5 for timeout in publisher.flushes)  # never beyond the bound
    assert dropped(registry, DropReason.EXIT) == 3
    assert dropped(registry, DropReason.CLOSED) == 0
    assert len(exit_lines(caplog)) == 1
    assert not [r for r in caplog.records if "did not take events" in r.getMessage()]


def test_at_exit_a_stage_before_the_sink_is_flushed_first_and_held_weakly(
    sink: AdapterSink, recorder: Recorder
) -> None:
    class Stage:
        def __init__(self) -> None:
            self.left: list[float] = []

        def flush(self, timeout: float) -> bool:
            self.left.append(timeout)
            owner(sink).emit(Kind.LEASE_RELEASED)  # its record becomes an event now
            return True

    stage, gone = Stage(), Stage()
    sink.flush_first(stage.flush)
    sink.flush_first(gone.flush)
    del gone
    _flush_at_exit([sink])
    assert len(stage.left) == 1 and 0 < stage.left[0] <= sink.exit_flush_s
    assert [e.kind for e in recorder.events] == [Kind.LEASE_RELEASED]


def test_the_exit_s_bound_is_a_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SPLITBRAIN_ADAPTER_EXIT_FLUSH_S", raising=False)
    assert AdapterSink("test").exit_flush_s == 5.0
    monkeypatch.setenv("SPLITBRAIN_ADAPTER_EXIT_FLUSH_S", "1.5")
    assert AdapterSink("test").exit_flush_s == 1.5
    assert AdapterSink("test", exit_flush_s=0).exit_flush_s == 0
    monkeypatch.setenv("SPLITBRAIN_ADAPTER_EXIT_FLUSH_S", "soon")
    assert AdapterSink("test").exit_flush_s == 5.0  # a bad value never stops the host
    (line,) = [r.getMessage() for r in caplog.records if "adapter sink" in r.getMessage()]
    assert line.startswith("adapter sink: SPLITBRAIN_ADAPTER_EXIT_FLUSH_S='soon': expected")
    with pytest.raises(ValueError, match="exit_flush_s"):
        AdapterSink("test", exit_flush_s=-1)


# ---- a producer that cannot be made: the log line says what to set ------------------------------


def no_producer_line(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture, **publisher: Any
) -> str:
    sink = AdapterSink("test", registry=registry, **publisher)
    try:
        owner(sink).emit(Kind.HEARTBEAT)
        assert sink.flush()
    finally:
        sink.close()
    assert dropped(registry, DropReason.KAFKA) == 1
    (line,) = [r.getMessage() for r in caplog.records if "no Kafka producer" in r.getMessage()]
    return line


def test_an_unset_broker_is_named_by_its_variable(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPLITBRAIN_BOOTSTRAP_SERVERS", raising=False)
    assert no_producer_line(registry, caplog) == (
        "adapter test: no Kafka producer: SPLITBRAIN_BOOTSTRAP_SERVERS is not set (librdkafka's "
        "bootstrap.servers: the Kafka cluster to publish to, e.g. kafka:9092); 1 event(s) dropped"
    )


def test_a_setting_librdkafka_refuses_is_named_by_its_variable(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("SPLITBRAIN_SECURITY_PROTOCOL", "bogus")
    assert no_producer_line(registry, caplog) == (
        'adapter test: no Kafka producer: Invalid value "bogus" for configuration property '
        '"security.protocol": set SPLITBRAIN_SECURITY_PROTOCOL; 1 event(s) dropped'
    )


def test_a_bad_variable_is_named_with_its_value(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("SPLITBRAIN_SASL_MECHANISM", "")
    line = no_producer_line(registry, caplog)
    assert line.startswith("adapter test: no Kafka producer: SPLITBRAIN_SASL_MECHANISM='': ")


def test_any_other_failure_of_the_default_producer_says_where_it_is_configured(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(cls: type[Emitter]) -> Emitter:
        raise OSError("no file descriptors")

    monkeypatch.setattr(Emitter, "from_env", classmethod(broken))
    assert no_producer_line(registry, caplog) == (
        "adapter test: no Kafka producer: OSError: no file descriptors (the producer is "
        "configured by SPLITBRAIN_BOOTSTRAP_SERVERS and the other SPLITBRAIN_* variables "
        "(docs/operating/security.md)); 1 event(s) dropped"
    )


def test_a_publisher_of_the_host_s_own_is_named_by_its_error(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Recorder:
        raise RuntimeError("bad configuration")

    assert no_producer_line(registry, caplog, publisher=broken) == (
        "adapter test: no Kafka producer: RuntimeError: bad configuration; 1 event(s) dropped"
    )


class ReturningKafka(Recorder):
    """Takes every event; Kafka acknowledges none of them until `back_at` (time.monotonic()),
    as the emitter across a broker restart: `flush` polls until then or its timeout."""

    def __init__(self, back_at: float) -> None:
        super().__init__()
        self.back_at = back_at
        self.acknowledged = 0

    def flush(self, timeout: float = 0) -> None:
        time.sleep(max(min(timeout, self.back_at - time.monotonic()), 0.0))
        if time.monotonic() < self.back_at:
            raise DeliveryError("not acknowledged", [], len(self.events) - self.acknowledged)
        self.acknowledged = len(self.events)


def test_close_waits_its_timeout_for_kafka_to_acknowledge_what_it_holds(
    registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped as the broker came back (the etcd campaign, seed 1, run 22): its
    events, held through the outage, were still unacknowledged when the sender's settle under
    way ended, and `close(5)` then gave Kafka one more second, not the rest of its five; the
    displaced holder's stale write never arrived."""
    monkeypatch.setattr("detector.adapters._sink._SETTLE_S", 1.0)
    kafka = ReturningKafka(back_at=time.monotonic() + 2.5)
    sink = AdapterSink("test", publisher=lambda: kafka, registry=registry)
    owner(sink).emit(Kind.HEARTBEAT, seq=1)
    time.sleep(0.5)  # the sender publishes it, then waits for Kafka (1 s, in vain)
    sink.close(3.0)  # Kafka is back 2 s after: within the close's bound
    assert kafka.acknowledged == 1
    assert dropped(registry, DropReason.CLOSED) == 0
