"""The bridge's state topic (`splitbrain.page-state.v1`, `detector.contracts.page_state`):
checked or created at start, read back on assignment, written before offsets are committed.

It is compacted and co-partitioned with the findings topic: a finding's state record goes to the
partition its revisions are in, so a bridge restores the state of exactly the partitions it is
assigned. Writes use an idempotent producer with `acks=all` and are flushed (acknowledged)
before the consumer commits the offsets they account for.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    ConfigResource,
    NewTopic,
)

from detector.errors import SplitbrainError
from detector.kafka.config import describe, fetch_metadata

_TIMEOUT: Final = 30.0
_RESTORE_TIMEOUT: Final = 120.0


class TopologyError(SplitbrainError, RuntimeError):
    """The findings topic is missing, or the state topic cannot serve it."""


class StateTopicError(SplitbrainError, RuntimeError):
    """A state record was not acknowledged: the offsets it accounts for are not committed."""


def ensure_state_topic(admin: AdminClient, findings_topic: str, state_topic: str) -> int:
    """The findings topic's partition count; the state topic is created (compacted, as many
    partitions and replicas as the findings topic) if it is missing, and checked if not."""
    topics = fetch_metadata(admin, _TIMEOUT).topics
    findings = topics.get(findings_topic)
    if findings is None or findings.error is not None or not findings.partitions:
        raise TopologyError(
            f"findings topic {findings_topic!r} does not exist: run `splitbrain topics apply`"
        )
    partitions = len(findings.partitions)
    replication = len(next(iter(findings.partitions.values())).replicas)
    state = topics.get(state_topic)
    if state is None or state.error is not None:
        topic = NewTopic(
            state_topic,
            num_partitions=partitions,
            replication_factor=replication,
            config={"cleanup.policy": "compact"},
        )
        for future in admin.create_topics([topic], request_timeout=_TIMEOUT).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        _wait_for_partitions(admin, state_topic, partitions)
        return partitions
    if len(state.partitions) != partitions:
        raise TopologyError(
            f"state topic {state_topic!r} has {len(state.partitions)} partitions, the findings "
            f"topic {findings_topic!r} has {partitions}: they must be co-partitioned"
        )
    resource = ConfigResource(ConfigResource.Type.TOPIC, state_topic)
    config = admin.describe_configs([resource], request_timeout=_TIMEOUT)[resource].result()
    policy = config["cleanup.policy"].value if "cleanup.policy" in config else "delete"
    if "compact" not in policy.split(","):
        raise TopologyError(
            f"state topic {state_topic!r} has cleanup.policy={policy}: it must be compacted, or "
            "the state of long-open findings expires with it"
        )
    return partitions


def _watermarks(consumer: Consumer, tp: TopicPartition) -> tuple[int, int]:
    """A partition's low and high watermarks; a topic created a moment ago may not be known to
    every broker yet (`Unknown partition`), so this asks again until `_TIMEOUT`."""
    deadline = time.monotonic() + _TIMEOUT
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=5.0)
            return int(low), int(high)
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise StateTopicError(f"{tp.topic}[{tp.partition}]: {describe(exc)}") from None
            time.sleep(0.2)


def _wait_for_partitions(admin: AdminClient, topic: str, partitions: int) -> None:
    """Until the metadata shows a topic just created with all its partitions and leaders."""
    deadline = time.monotonic() + _TIMEOUT
    while True:
        found = fetch_metadata(admin, _TIMEOUT, topic).topics.get(topic)
        if (
            found is not None
            and found.error is None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 for p in found.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise TopologyError(f"state topic {topic!r} created but not available in time")
        time.sleep(0.2)


class StateTopic:
    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        self.config = dict(config)
        self.topic = topic
        self.producer = Producer(
            {
                **self.config,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                # Bounded, so that a broker that is gone ends the bridge (its supervisor restarts
                # it) rather than holding it forever; nothing is committed without the state.
                "message.timeout.ms": 120_000,
            }
        )

    def read(self, partitions: list[int]) -> Iterator[tuple[int, int, bytes, bytes | None]]:
        """(partition, offset, key, value) of every record of `partitions`, from the start to
        the end as of this call; a value of None is a tombstone."""
        consumer = Consumer(
            {
                **self.config,
                "group.id": f"splitbrain-page-restore-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        try:
            ends: dict[int, int] = {}
            for p in partitions:
                low, high = _watermarks(consumer, TopicPartition(self.topic, p))
                if high > low:
                    ends[p] = high
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in ends])
            deadline = time.monotonic() + _RESTORE_TIMEOUT
            while ends:
                if time.monotonic() > deadline:
                    raise StateTopicError(
                        f"{self.topic}: partitions {sorted(ends)} not read to their end in "
                        f"{_RESTORE_TIMEOUT:.0f} s"
                    )
                for msg in consumer.consume(500, timeout=0.2):
                    err = msg.error()
                    if err is not None:
                        if err.fatal():
                            raise KafkaException(err)
                        continue
                    part, offset = msg.partition(), msg.offset()
                    assert part is not None and offset is not None
                    yield part, offset, msg.key() or b"", msg.value()
                    if offset + 1 >= ends.get(part, 0):
                        ends.pop(part, None)
                if ends:
                    # A compacted partition may end in offsets compaction removed: done when the
                    # position reaches the end seen at the start.
                    for tp in consumer.position([TopicPartition(self.topic, p) for p in ends]):
                        if tp.offset >= ends[tp.partition]:
                            ends.pop(tp.partition)
        finally:
            consumer.close()

    def write(self, items: list[tuple[str, int, bytes | None]]) -> None:
        """Each (finding id, partition, record or None for a tombstone), acknowledged by the
        broker before this returns; a `StateTopicError` if any was not."""
        errors: list[str] = []

        def delivered(err: KafkaError | None, msg: object) -> None:
            if err is not None:
                errors.append(err.str())

        for key, partition, value in items:
            self.producer.produce(
                self.topic,
                key=key.encode(),
                value=value,
                partition=partition,
                on_delivery=delivered,
            )
            self.producer.poll(0)
        while self.producer.flush(1.0) > 0:
            pass  # message.timeout.ms bounds this: an undeliverable record fails in `delivered`
        if errors:
            raise StateTopicError(
                f"{len(errors)} state record(s) not written to {self.topic}: {errors[0]}"
            )

    def close(self) -> None:
        self.producer.flush(10)
