"""What one transaction carries, the same in both runtimes.

As quixstreams' `Checkpoint` does: the consumed offsets, the records produced (finding revisions
and dead letters), the state writes that record them and the work the metrics count, kept in one
object that a commit or an abort ends as one: the counts of a committed transaction are observed,
those of an aborted one dropped (its work is done again, and counted then). The processing step
(`detector.runtime.processor`) decides what to write; the checkpoint turns that into `Record`s,
the bytes each topic takes; a runtime only moves them, into the transaction of the input
partition they came from: the confluent-kafka loop through `detector.runtime.output`, faust
through its transactional producer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from detector.runtime.processor import PartitionProcessor, Writes
from detector.runtime.settings import WorkerSettings
from detector.telemetry.metrics import WorkerMetrics


class Record(NamedTuple):
    """One record of a transaction, to the partition of the input it came from."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None  # None: a tombstone
    headers: list[tuple[str, str | bytes | None]] | None = None


_NOTHING: Final[tuple[Record, ...]] = ()  # what most steps produce: no list to build per record


class LocalStates(Protocol):
    """A runtime's local copy of one partition's encoded states."""

    def put(self, key: str, raw: bytes | None) -> None:
        """A state just written to the changelog in the open transaction; None removes it."""


@dataclass(slots=True)
class _Changed:
    processor: PartitionProcessor
    local: LocalStates
    keys: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Checkpoint:
    """The open transaction of a worker: `offsets` to commit, `events` consumed into it, the
    workflows whose state it must write, and what its processors counted in `metrics` (which
    holds the counts until `committed` or `aborted` says what became of them).

    `offsets` outlive a commit: the next offset to consume of each input partition the worker
    processed since it got it (its lag, and faust's guard against redelivered records), until
    `forget`. A workflow changed by several records is encoded once per call of `states`: the
    confluent-kafka loop calls it at the commit; the faust agent after each event, since faust's
    consumer, not the agent, decides when a transaction commits.
    """

    findings_topic: str
    dlq_topic: str
    changelog_topic: str
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    events: int = 0
    opened_at: float | None = None  # monotonic; None: no transaction open
    # The worker's; a checkpoint built without them (a test's) counts into its own.
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics, repr=False)
    _changed: dict[int, _Changed] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(cls, settings: WorkerSettings, metrics: WorkerMetrics) -> Checkpoint:
        return cls(
            settings.findings_topic, settings.dlq_topic, settings.changelog_topic, metrics=metrics
        )

    def begin(self) -> None:
        """A transaction opens (the confluent-kafka loop opens its own)."""
        self.opened_at = time.monotonic()

    def due(self, max_events: int, interval_ms: int) -> bool:
        """Whether the open transaction holds enough events, or has been open long enough."""
        opened = self.opened_at
        return opened is not None and (
            self.events >= max_events or (time.monotonic() - opened) * 1000 >= interval_ms
        )

    def consumed(self, topic: str, partition: int, offset: int) -> None:
        """An input record is done: the commit moves past it."""
        self.offsets[(topic, partition)] = offset + 1
        self.events += 1

    def take(
        self, processor: PartitionProcessor, local: LocalStates, writes: Writes
    ) -> Sequence[Record]:
        """The records to produce for one step of `processor`, in its partition; the workflows
        it changed are written by `states`."""
        partition = processor.partition
        if writes.changed:
            changed = self._changed.get(partition)
            if changed is None:
                changed = self._changed[partition] = _Changed(processor, local)
            changed.keys |= writes.changed
        dead = writes.dead_letter
        if dead is None and not writes.findings:
            return _NOTHING
        records: list[Record] = []
        if dead is not None:
            records.append(Record(self.dlq_topic, partition, dead.key, dead.value, dead.headers()))
        for update in writes.findings:
            f = update.finding
            records.append(
                Record(
                    self.findings_topic, partition, f.workflow_key.encode(), f.to_json().encode()
                )
            )
        return records

    def states(self) -> list[Record]:
        """The changelog records of the workflows changed since the last call (a tombstone for
        an evicted one), each kept in its runtime's local copy too."""
        records: list[Record] = []
        for partition, changed in self._changed.items():
            for key in changed.keys:
                raw = changed.processor.encoded_state(key)
                records.append(Record(self.changelog_topic, partition, key.encode(), raw))
                changed.local.put(key, raw)
        self._changed.clear()
        return records

    def touched(self, partition: int) -> bool:
        """Whether the open transaction changed a workflow state of input `partition`: until it
        commits, that partition's local copy is ahead of its changelog."""
        return partition in self._changed

    def committed(self, seconds: float, partitions: Iterable[int] | None = None) -> None:
        """The transaction committed in `seconds` the work of input `partitions` (None: every
        one): what they counted is observed, and the next transaction starts empty."""
        self.metrics.committed(seconds, self.events, partitions)
        self.end()

    def aborted(self) -> None:
        """The transaction aborted (or Kafka aborts it): what it counted is dropped, and the
        next one starts empty."""
        self.metrics.aborted()
        self.end()

    def revoked(self, partitions: Iterable[int]) -> None:
        """Input partitions left with work of the open transaction: their next owner does it
        again, and counts it then."""
        self.metrics.revoked(partitions)

    def end(self) -> None:
        """The transaction is over, whatever became of it: the next one starts empty."""
        self.opened_at = None
        self.events = 0
        self._changed.clear()

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Input partitions that moved, or are restored: their offsets go with them."""
        for tp in partitions:
            self.offsets.pop(tp, None)
