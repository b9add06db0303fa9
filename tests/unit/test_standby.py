"""The kafka runtime's standby copies (`detector.runtime.standby`), on a scripted consumer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from detector.core import WorkflowState, encode_state
from detector.runtime import standby as standby_module
from detector.runtime.standby import Standby, WarmCopy
from detector.runtime.store import MemoryStore
from detector.telemetry.metrics import WorkerMetrics

TOPIC = "changelog"
STATE = encode_state(WorkflowState(pos=1, max_seq=1, last_at=1.0))


@dataclass
class Fetched:
    """A fetched message as confluent-kafka hands it over: a record, or a partition's end."""

    part: int
    at: int
    k: bytes | None = None
    v: bytes | None = None
    end: bool = False

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.at

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self.end else None


@dataclass
class ScriptedConsumer:
    """Hands out what a test queued; remembers every assignment."""

    queued: list[Fetched] = field(default_factory=list)
    assignments: list[dict[int, int]] = field(default_factory=list)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assignments.append({tp.partition: tp.offset for tp in partitions})

    def consume(self, num_messages: int, timeout: float) -> list[Fetched]:
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        return 0, 10

    def close(self) -> None:
        pass


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> ScriptedConsumer:
    scripted = ScriptedConsumer()

    def state_consumer(config: Mapping[str, Any], group_id: str, on_error: object) -> Any:
        return scripted

    monkeypatch.setattr(standby_module, "state_consumer", state_consumer)
    return scripted


def standby(metrics: WorkerMetrics | None = None) -> Standby:
    return Standby(
        {},
        TOPIC,
        group_id="g-standby",
        open_store=lambda partition: MemoryStore(),
        metrics=metrics or WorkerMetrics(),
        on_error=lambda error: None,
    )


def test_copies_follow_the_changelog_from_the_beginning_and_apply_tombstones(
    consumer: ScriptedConsumer,
) -> None:
    s = standby()
    s.track([1, 2])
    assert consumer.assignments[-1] == {1: OFFSET_BEGINNING, 2: OFFSET_BEGINNING}
    consumer.queued = [
        Fetched(1, 0, b"a", STATE),
        Fetched(1, 1, b"b", STATE),
        Fetched(1, 2, b"a", None),  # a tombstone: the workflow was evicted
        Fetched(2, 5, None, b"x"),  # no key: not a state
        Fetched(2, 7, end=True),  # the end, past a transaction marker
    ]
    s.poll()
    assert list(s.copies[1].store.states) == ["b"]
    assert s.copies[1].position == 3
    assert s.copies[2].position == 7
    assert not s.behind


def test_a_taken_copy_is_no_longer_read_and_records_in_flight_are_not_applied(
    consumer: ScriptedConsumer,
) -> None:
    s = standby()
    s.track([0, 1])
    consumer.queued = [Fetched(0, 0, b"a", STATE)]
    s.poll()
    taken = s.take([0, 5])  # 5 was never kept: restored from the beginning by its owner
    assert list(taken) == [0]
    assert taken[0].position == 1
    assert consumer.assignments[-1] == {1: OFFSET_BEGINNING}
    consumer.queued = [Fetched(0, 1, b"b", STATE)]  # fetched before the unassignment
    s.poll()
    assert list(taken[0].store.states) == ["a"]


def test_a_revoked_partition_is_kept_warm_from_the_position_its_owner_gave(
    consumer: ScriptedConsumer,
) -> None:
    s = standby()
    store = MemoryStore()
    store.load("a", STATE)
    s.keep({3: WarmCopy(store, 42)})
    assert consumer.assignments[-1] == {3: 42}
    consumer.queued = [Fetched(3, 40, b"a", None)]  # from before: the store is past it
    s.poll()
    assert list(s.copies[3].store.states) == ["a"]
    assert s.copies[3].position == 42
    s.track([1])  # the next assignment gave 3 to another member, which does not want it
    assert consumer.assignments[-1] == {1: OFFSET_BEGINNING}
    assert 3 not in s.copies


def test_the_lag_is_exported_per_warm_partition_and_gone_with_it(
    consumer: ScriptedConsumer,
) -> None:
    metrics = WorkerMetrics()
    s = standby(metrics)
    s.track([0])
    consumer.queued = [Fetched(0, 3, b"a", STATE)]
    s.poll()
    lag = metrics.registry.get_sample_value("splitbrain_standby_lag_records", {"partition": "0"})
    assert lag == 6  # end 10, next offset 4
    s.take([0])
    assert (
        metrics.registry.get_sample_value("splitbrain_standby_lag_records", {"partition": "0"})
        is None
    )
