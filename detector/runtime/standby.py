"""Standby replicas for the confluent-kafka loop: warm copies of partitions a member does not own.

As Kafka Streams' `num.standby.replicas`: a member reads the changelog partitions of input
partitions it does not own, with a consumer of its own (`assign`, read_committed, no group), into
stores of its own, through `Store.load` as a restore does. When the group hands it one of them
(a failover, a member leaving), the restore reads from the position the copy reached instead of
from the beginning (`StateRestore.read(starts=...)`), still to the changelog's high watermark as
it is then: a copy is never used before it has caught up, and the read_committed reads never
apply a record of an aborted transaction (a dead owner's). A partition the member owns is never
read here: `take` hands its copy over, and unassigns it, before the owner's restore.

Memory and changelog reads grow with what is kept warm (`--standby all`: the whole state in every
member), for a takeover that reads the changelog's tail only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from detector.kafka.stateful.recovery import state_consumer, state_records
from detector.runtime.store import Store
from detector.telemetry.metrics import WorkerMetrics

_BATCH: Final = 2000  # records applied per poll: a step of the loop is not held for long
_METRICS_EVERY_S: Final = 5.0


@dataclass(slots=True)
class WarmCopy:
    """One partition's store, holding the changelog read_committed up to `position` (the next
    offset to read; `OFFSET_BEGINNING` before anything was read)."""

    store: Store
    position: int = OFFSET_BEGINNING


class Standby:
    """The warm copies of one member, and the consumer that keeps them up to date.

    `behind`: the last `poll` applied a full batch, so more is ready to read (the loop then polls
    its input without waiting).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        group_id: str,
        open_store: Callable[[int], Store],
        metrics: WorkerMetrics,
        on_error: Callable[[object], None],
    ) -> None:
        self.topic = topic
        self.copies: dict[int, WarmCopy] = {}
        self.behind = False
        self._open = open_store
        self._metrics = metrics
        self._report = on_error
        self._consumer = state_consumer(config, group_id, on_error)
        self._measured = 0.0

    def track(self, partitions: Iterable[int]) -> None:
        """Keep exactly `partitions` warm: one not kept yet from the changelog's beginning, one
        no longer wanted dropped."""
        wanted = set(partitions)
        for partition in self.copies.keys() - wanted:
            self.copies.pop(partition).store.close()
            self._metrics.standby_lag(partition, None)
        for partition in wanted - self.copies.keys():
            self.copies[partition] = WarmCopy(self._open(partition))
        self._assign()

    def keep(self, copies: Mapping[int, WarmCopy]) -> None:
        """Stores of partitions this member gave up, each holding the changelog up to its
        position (`PartitionState.position`): kept warm from there. A position short of the
        changelog's end costs records read again, to the same states; one past it would skip
        states, so a position is what the owner knows, never the end it asks for."""
        for partition, copy in copies.items():
            old = self.copies.pop(partition, None)
            if old is not None:
                old.store.close()
            self.copies[partition] = copy
        self._assign()

    def take(self, partitions: Iterable[int]) -> dict[int, WarmCopy]:
        """The copies of `partitions`, which this member now owns: no longer read here. Each
        must be caught up to the changelog's end before it is used."""
        taken = {p: copy for p in partitions if (copy := self.copies.pop(p, None)) is not None}
        for partition in taken:
            self._metrics.standby_lag(partition, None)
        if taken:
            self._assign()
        return taken

    def poll(self) -> None:
        """Apply what the consumer has fetched, without waiting for more."""
        if not self.copies:
            self.behind = False
            return
        messages = self._consumer.consume(num_messages=_BATCH, timeout=0)
        copies = self.copies
        for partition, offset, key, value in state_records(
            self.topic, messages, self._caught_up, self._report
        ):
            copy = copies.get(partition)
            # None: taken while its records were in flight. Below the position: fetched before
            # the copy was assigned again from further on; a copy only moves forward.
            if copy is not None and offset >= copy.position:
                copy.store.load(key.decode(), value)
                copy.position = offset + 1
        self.behind = len(messages) == _BATCH
        now = time.monotonic()
        if now - self._measured >= _METRICS_EVERY_S:
            self._measured = now
            for partition, copy in copies.items():
                self._metrics.standby_lag(partition, self._lag(partition, copy.position))

    def close(self) -> None:
        self._consumer.close()
        for partition, copy in self.copies.items():
            copy.store.close()
            self._metrics.standby_lag(partition, None)
        self.copies.clear()

    def _caught_up(self, partition: int, offset: int) -> None:
        """The end of a partition (its last stable offset): what lies before it is applied,
        or was aborted or a transaction marker."""
        copy = self.copies.get(partition)
        if copy is not None:
            copy.position = max(copy.position, offset)

    def _assign(self) -> None:
        """Every copy, from its position (a copy kept from a revoked partition, from where its
        store stands)."""
        self._consumer.assign(
            [TopicPartition(self.topic, p, copy.position) for p, copy in self.copies.items()]
        )

    def _lag(self, partition: int, position: int) -> int | None:
        """From the high watermark the last fetch reported (no broker round trip)."""
        try:
            _, end = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), cached=True
            )
        except KafkaException:  # a metric never stops the loop
            return None
        return None if end < 0 else end - max(position, 0)
