"""What committing a batch means to the kafka runtime: one Kafka transaction, or at least once.

`TransactionalOutput` (exactly-once) writes a batch's findings, dead letters, changelog states and
consumed offsets in one transaction: all of it commits or none of it, a zombie is fenced, and a
(finding_id, revision) pair is never written twice. `AtLeastOnceOutput` pays for no transaction:
it waits until the broker acknowledged the output, then commits the offsets with the consumer.
A crash loses nothing, since no offset is committed before what it produced was acknowledged;
but a crash or rebalance in between writes that output again from the last committed offsets, so
readers must dedupe on (finding_id, revision). Nor is a worker that lost its partitions while
paused fenced: what it writes when it wakes up, stale changelog states included, lands too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from detector.runtime.checkpoint import Record
from detector.runtime.settings import WorkerSettings

# Told of one record's delivery: its error, or None and the record with its offset.
Delivered = Callable[[KafkaError | None, Message], None]

CALL_TIMEOUT_S: Final = 30.0  # how long a transaction call waits; at least once, a record's ack
_FLUSH_S: Final = CALL_TIMEOUT_S + 5.0  # every record is acked or failed by then


class Output(Protocol):
    """Where a batch is written, and what beginning, committing and discarding it take."""

    def produce(self, record: Record, on_delivery: Delivered | None = None) -> None:
        """One record of the batch (`detector.runtime.checkpoint`); `on_delivery` hears of its
        delivery before the batch's commit returns (exactly once; at least once tells nobody of
        one record: a failure fails the batch)."""

    @property
    def commits_on_revoke(self) -> bool:
        """Whether a rebalance commits the open batch rather than discarding it."""

    @property
    def renews_after_timeout(self) -> bool:
        """Whether a batch that timed out, once aborted, is followed by a new client (`renew`)
        rather than retried with the same one."""

    def start(self) -> None:
        """Before the first batch."""

    def begin(self) -> None:
        """Before the first record of a batch is written."""

    def deliver(self) -> None:
        """Between the batch's findings and dead letters and the changelog states that record
        them; a `KafkaException` when some were not written."""

    def commit(self, offsets: list[TopicPartition]) -> None:
        """The batch and its consumed `offsets`, durably; a `KafkaException` when it failed."""

    def abort(self) -> None:
        """The batch is given up: the worker rebuilds its state and rewinds to committed offsets."""

    def renew(self, *, fenced: bool) -> bool:
        """A new producer in place of this one (then `start` it), when this one cannot end its
        transaction; `fenced`: after a fatal error, which another instance may have caused.
        False when this process must stop instead."""


def open_output(settings: WorkerSettings, consumer: Consumer) -> Output:
    """The output of `settings.processing_guarantee`, committing `consumer`'s offsets."""
    if settings.processing_guarantee == "at-least-once":
        return AtLeastOnceOutput(settings, consumer)
    return TransactionalOutput(settings, consumer)


def _producer_config(settings: WorkerSettings) -> dict[str, Any]:
    """What both guarantees produce with: an idempotent producer, acked by every replica."""
    return {
        **settings.kafka,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.max.bytes": 4 * 1024 * 1024,
        # The changelog carries a workflow's whole state per event it touched: lz4 makes it a
        # quarter of the size, and the broker's work less (bench/bench_worker.py).
        "compression.type": "lz4",
    }


class _Producing:
    """Both guarantees write a record the same way; only what ends the batch differs."""

    producer: Producer

    def produce(self, record: Record, on_delivery: Delivered | None = None) -> None:
        self.producer.produce(
            record.topic,
            key=record.key,
            value=record.value,
            headers=record.headers,
            partition=record.partition,
            on_delivery=on_delivery,
        )


class TransactionalOutput(_Producing):
    """Exactly once: the offsets go into the transaction with the consumer's group metadata
    (KIP-447), so a zombie is fenced by the group generation; the stable transactional id fences
    this worker's previous incarnation."""

    commits_on_revoke: Final = False  # the next owner redoes the batch from committed state
    # A client whose cached coordinator went away can time out on every transaction that follows
    # (librdkafka #5456, #5511: after a broker's kill -9, AddOffsetsToTxn timed out 14 times in a
    # row in CI); a new one looks its coordinators up afresh.
    renews_after_timeout: Final = True

    def __init__(self, settings: WorkerSettings, consumer: Consumer) -> None:
        self._config: Final = {
            **_producer_config(settings),
            "transactional.id": settings.transactional_id,
            "transaction.timeout.ms": settings.transaction_timeout_ms,
        }
        self._timeout_s: Final = settings.transaction_timeout_ms / 1000
        self.producer = Producer(self._config)
        self._consumer = consumer
        self._open_since: float | None = None  # monotonic, while a transaction is open

    def start(self) -> None:
        self.producer.init_transactions(CALL_TIMEOUT_S)

    def begin(self) -> None:
        self.producer.begin_transaction()
        self._open_since = time.monotonic()

    def deliver(self) -> None:
        """Nothing to wait for: the commit covers the findings and the states alike."""

    def commit(self, offsets: list[TopicPartition]) -> None:
        if offsets:
            self.producer.send_offsets_to_transaction(
                offsets, self._consumer.consumer_group_metadata(), CALL_TIMEOUT_S
            )
        self.producer.commit_transaction(CALL_TIMEOUT_S)
        self._open_since = None

    def abort(self) -> None:
        self.producer.abort_transaction(CALL_TIMEOUT_S)
        self._open_since = None

    def renew(self, *, fenced: bool) -> bool:
        """Fenced, only when the open transaction outlived its timeout: then its coordinator
        aborted it on its own (two brokers of three down, or one slow: it could not commit in
        time) and bumped the producer's epoch, and that is the fatal error (PRODUCER_FENCED, or
        INVALID_TXN_STATE when our abort crossed the coordinator's). Sooner, a new instance of
        our transactional id fenced this one. Not fenced (an abort that timed out, or that a
        commit still in progress refuses), always. The new producer's `init_transactions` ends
        the old one's transaction first, committed or aborted: the worker then rewinds to
        whatever Kafka holds."""
        since = self._open_since
        if fenced and (since is None or time.monotonic() - since < self._timeout_s):
            return False
        self.producer.purge()
        self.producer = Producer(self._config)
        self._open_since = None
        return True


class AtLeastOnceOutput(_Producing):
    """At least once: the batch is flushed, and the offsets committed only once the broker
    acknowledged it all. A failed delivery fails the commit, so its offsets are never committed."""

    commits_on_revoke: Final = True  # or the next owner writes the batch again
    renews_after_timeout: Final = False  # no coordinator to lose; and `renew` would stop

    def __init__(self, settings: WorkerSettings, consumer: Consumer) -> None:
        self.producer = Producer(
            {
                **_producer_config(settings),
                # Bounded as in a transaction: a broker that is down fails the commit in this
                # time, not in librdkafka's default five minutes.
                "message.timeout.ms": int(CALL_TIMEOUT_S * 1000),
                # Only a failure needs a look: no Python call per record acknowledged.
                "delivery.report.only.error": True,
                "on_delivery": self._delivered,
            }
        )
        self._consumer = consumer
        self._failure: KafkaError | None = None

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None and self._failure is None:
            self._failure = err

    def produce(self, record: Record, on_delivery: Delivered | None = None) -> None:
        """Without `on_delivery`: a success is never reported, and a failure must reach
        `_delivered`."""
        super().produce(record)

    def start(self) -> None:
        """No transactional id to fence a previous incarnation with."""

    def begin(self) -> None:
        """No transaction to open."""

    def deliver(self) -> None:
        """Everything produced so far is acknowledged: before the changelog, no state records a
        revision that was lost; before the offsets, no offset passes output that was lost."""
        left = self.producer.flush(_FLUSH_S)
        if self._failure is not None:
            raise KafkaException(self._failure)
        if left:
            reason = f"{left} records not acknowledged in {_FLUSH_S:g} s"
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, reason))

    def commit(self, offsets: list[TopicPartition]) -> None:
        self.deliver()
        if offsets:
            for tp in self._consumer.commit(offsets=offsets, asynchronous=False):
                if tp.error is not None:
                    raise KafkaException(tp.error)

    def abort(self) -> None:
        """Nothing to undo (what landed is written again, or recorded by the changelog): wait out
        what is in flight, so that its late failure cannot fail the next batch's commit."""
        self.producer.flush(_FLUSH_S)
        self._failure = None

    def renew(self, *, fenced: bool) -> bool:
        """Its abort cannot fail; a fatal error of an idempotent producer (a sequence gap)
        leaves what it wrote unknown: stop."""
        return False
