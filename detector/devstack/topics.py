"""Fresh topics for a worker, and what a downstream reader of them sees: read_committed records,
end offsets, the group's committed offsets and open transactions.

The tests, the torture harness and the benchmarks judge the worker through these, so they all see
its output the way a consumer in production does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, NamedTuple, Self

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from detector.contracts.events import MAX_EVENT_BYTES
from detector.contracts.topics import changelog_topic
from detector.errors import SplitbrainError
from detector.kafka.offsets import end_offsets as kafka_end_offsets

# A dead letter carries the largest record the input accepts, plus its error headers.
_DLQ_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
assert MAX_EVENT_BYTES < _DLQ_MAX_MESSAGE_BYTES


class ReadError(SplitbrainError, RuntimeError):
    """A topic could not be read to its end in time, or the broker reported an error."""


def create_topics(
    config: Mapping[str, Any], topics: Iterable[NewTopic], timeout: float = 30.0
) -> None:
    """Create topics that do not exist yet, through a client of their own.

    A new client may send its first request over its bootstrap connection, which librdkafka
    removes once a Metadata response lists the brokers without it (2.10, #4557): the request
    then fails with `_DESTROY_BROKER`, whether or not the broker did it (CI, 2026-12-06, on the
    three-broker cluster). It is asked once more, and a topic that exists by then is the first
    request's.
    """
    admin = AdminClient(dict(config))  # held until its futures are done: they die with it
    pending, again = list(topics), False
    while pending:
        futures = admin.create_topics(pending, request_timeout=timeout)
        retry: list[NewTopic] = []
        for new in pending:
            try:
                futures[new.topic].result(timeout)
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError._DESTROY_BROKER and not again:
                    retry.append(new)
                elif not (again and code == KafkaError.TOPIC_ALREADY_EXISTS):
                    raise
        pending, again = retry, True


@dataclass(frozen=True, slots=True)
class WorkerTopics:
    """The input, findings and DLQ topics and the consumer group of one worker deployment."""

    input: str
    findings: str
    dlq: str
    group: str

    @classmethod
    def fresh(cls, prefix: str) -> WorkerTopics:
        tag = f"{prefix}-{uuid.uuid4().hex[:8]}"
        return cls(f"{tag}.in", f"{tag}.findings", f"{tag}.dlq", tag)

    @property
    def changelog(self) -> str:
        return changelog_topic(self.group)

    def create(
        self,
        config: Mapping[str, Any],
        partitions: int,
        timeout: float = 30.0,
        *,
        replication: int = 1,
    ) -> Self:
        """Create the three topics with the same partition count: replication 1 on a dev broker;
        on a cluster, 3 with `min.insync.replicas` 2, as topics/topics.yaml's default profile."""
        isr = {"min.insync.replicas": str(min(2, replication))}
        big = {"max.message.bytes": str(_DLQ_MAX_MESSAGE_BYTES), **isr}
        new = [
            NewTopic(self.input, partitions, replication, config=isr),
            NewTopic(self.findings, partitions, replication, config=isr),
            NewTopic(self.dlq, partitions, replication, config=big),
        ]
        create_topics(config, new, timeout)
        return self


class Record(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


def _partitions(admin: AdminClient, topic: str) -> list[int]:
    metadata = admin.list_topics(topic, timeout=30).topics[topic]
    if metadata.error is not None:
        raise ReadError(f"{topic}: {metadata.error.str()}")
    return sorted(metadata.partitions)


def end_offsets(
    admin: AdminClient, topic: str, isolation: IsolationLevel = IsolationLevel.READ_COMMITTED
) -> dict[int, int]:
    """Per partition: the last stable offset (read_committed) or the high watermark."""
    return kafka_end_offsets(admin, topic, _partitions(admin, topic), isolation)


def group_offsets(admin: AdminClient, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset of each partition (-1 where it committed none)."""
    parts = [TopicPartition(topic, p) for p in _partitions(admin, topic)]
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])
    result = next(iter(futures.values())).result(30)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def open_transactions(admin: AdminClient, topics: Iterable[str]) -> list[str]:
    """The partitions, among `topics` that exist, whose last stable offset is behind the high
    watermark: a transaction writing to them is still open."""
    existing = admin.list_topics(timeout=30).topics
    found = []
    for topic in (t for t in topics if t in existing):
        stable = end_offsets(admin, topic, IsolationLevel.READ_COMMITTED)
        high = end_offsets(admin, topic, IsolationLevel.READ_UNCOMMITTED)
        found += [f"{topic}[{p}]" for p in high if stable[p] < high[p]]
    return found


def lagging_partitions(admin: AdminClient, topics: WorkerTopics) -> list[int]:
    """The input partitions the group has not committed to their end (an empty one has none
    to commit)."""
    ends = end_offsets(admin, topics.input, IsolationLevel.READ_UNCOMMITTED)
    committed = group_offsets(admin, topics.group, topics.input)
    return sorted(p for p, end in ends.items() if end and committed.get(p, -1) < end)


def quiescent(admin: AdminClient, topics: WorkerTopics) -> bool:
    """The group committed the whole input and no transaction on an output is open: nothing more
    will appear on the outputs until more input arrives."""
    outputs = (topics.findings, topics.dlq, topics.changelog)
    return not lagging_partitions(admin, topics) and not open_transactions(admin, outputs)


class TopicReader:
    """Every partition of a topic from its beginning, as a read_committed consumer sees it.

    `poll` adds what is readable now to `records`; `read_to_end` reads everything committed
    before the call. Assigned, not subscribed: no group, nothing committed.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
    ) -> None:
        self.topic = topic
        self.isolation = isolation
        self.records: list[Record] = []
        self._admin = AdminClient(dict(config))
        level = (
            "read_committed" if isolation == IsolationLevel.READ_COMMITTED else "read_uncommitted"
        )
        self._consumer = Consumer(
            {
                **config,
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": level,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        self._parts = [TopicPartition(topic, p) for p in _partitions(self._admin, topic)]
        self._consumer.assign(
            [TopicPartition(topic, tp.partition, OFFSET_BEGINNING) for tp in self._parts]
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._consumer.close()

    def poll(self, seconds: float = 0.5) -> list[Record]:
        """Read for about `seconds`; the records read, also appended to `records`."""
        new: list[Record] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for msg in self._consumer.consume(500, timeout=min(left, 0.2)):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise ReadError(f"{self.topic}: {err.str()}")
                raw = msg.headers() or []
                pairs = raw.items() if isinstance(raw, dict) else raw
                headers = {k: v.encode() if isinstance(v, str) else v or b"" for k, v in pairs}
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                new.append(Record(partition, offset, msg.key(), msg.value() or b"", headers))
        self.records += new
        return new

    def read_to_end(self, timeout: float = 60.0) -> list[Record]:
        """Read until every partition's position reaches its end offset as of this call."""
        ends = end_offsets(self._admin, self.topic, self.isolation)
        deadline = time.monotonic() + timeout
        while any(
            ends[tp.partition] > max(tp.offset, 0) for tp in self._consumer.position(self._parts)
        ):
            if time.monotonic() > deadline:
                raise ReadError(f"{self.topic}: not read to its end in {timeout:.0f} s")
            self.poll(0.2)
        return self.records


def read_committed(config: Mapping[str, Any], topic: str, timeout: float = 60.0) -> list[Record]:
    """Every record of `topic` a read_committed consumer sees, up to its end now."""
    with TopicReader(config, topic) as reader:
        return reader.read_to_end(timeout)
