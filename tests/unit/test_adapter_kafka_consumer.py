"""What `ConsumerWatch` reads without a broker: the generation librdkafka serialises (none
before the member joined a group), and a record's processing outside any partition it owns. The
group's callbacks, rebalances and the zombie run on the real broker in
tests/integration/test_adapter_kafka_consumer.py."""

from __future__ import annotations

import struct
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import CollectorRegistry

from detector.adapters import AdapterSink, current, effect_committed
from detector.adapters.kafka_consumer import ConsumerWatch, effect_key, generation
from tests.unit.test_adapter_sink import Recorder


class Metadata:
    """A consumer whose group metadata is librdkafka's serialised form, as given."""

    def __init__(self, meta: object) -> None:
        self.meta = meta

    def consumer_group_metadata(self) -> object:
        return self.meta


def test_the_generation_is_read_from_librdkafka_s_serialised_group_metadata() -> None:
    # librdkafka copies the int32 as it lies in memory: the machine's own byte order (read
    # big-endian on x86, the campaign saw generation 1 as 16777216, and 128 on would be None).
    assert generation(Metadata(b"CGMDv2:" + struct.pack("=i", 7) + b"payments")) == 7  # type: ignore[arg-type]
    assert generation(Metadata(b"CGMDv2:" + struct.pack("=i", 300) + b"payments")) == 300  # type: ignore[arg-type]
    assert generation(Metadata(b"CGMDv2:" + struct.pack("=i", -1) + b"g")) is None  # type: ignore[arg-type]
    assert generation(Metadata(b"CGMDv9:junk")) is None  # type: ignore[arg-type]
    assert generation(Metadata(object())) is None  # type: ignore[arg-type]


def test_a_consumer_that_joined_no_group_has_no_generation() -> None:
    consumer = Consumer({"group.id": "g", "bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    try:
        assert generation(consumer) is None
    finally:
        consumer.close()


def test_a_record_of_a_partition_not_owned_is_processed_as_no_one() -> None:
    recorder = Recorder()
    sink = AdapterSink("kafka-consumer", publisher=lambda: recorder, registry=CollectorRegistry())
    consumer = Consumer({"group.id": "g", "bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    try:
        watch = ConsumerWatch(consumer, "g", sink=sink, worker_id="w")
        msg = Message(topic="orders", partition=3, offset=1042, value=b"x")
        with watch.processing(msg) as key:
            assert key == effect_key(msg) == "orders/3/1042"
            assert current() is None
            assert not effect_committed(key)
        assert sink.flush(5)
        assert recorder.events == []
    finally:
        consumer.close()
        sink.close()


def test_a_member_s_events_reach_kafka_before_it_hands_its_partitions_on() -> None:
    """The group gives a revoked or left partition to another member only once this one has
    rejoined or left, so its last effects, flushed first, arrive before the successor's
    acquisition. Sent later, a clean handoff's last commit arrived after it and looked stale (a
    false critical finding in the kafka-consumer campaign)."""
    calls: list[str] = []

    class Sink(AdapterSink):
        def flush(self, timeout: float = 10.0) -> bool:
            calls.append("flush")
            return super().flush(timeout)

    class Member:
        def subscribe(self, topics: list[str], **callbacks: Any) -> None:
            self.on_revoke = callbacks["on_revoke"]

        def close(self) -> None:
            calls.append("close")

    sink = Sink("kafka-consumer", publisher=Recorder, registry=CollectorRegistry())
    member = Member()
    watch = ConsumerWatch(member, "g", sink=sink, worker_id="w")  # type: ignore[arg-type]
    watch.subscribe(["orders"])
    member.on_revoke(member, [TopicPartition("orders", 3)])
    assert calls == ["flush"]
    watch.close()
    assert calls == ["flush", "flush", "close"]
    sink.close()
