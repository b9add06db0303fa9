"""The confluent-kafka runtime: consume, detect, produce — in one Kafka transaction per batch.

Findings, dead letters, the state changelog and the consumed offsets commit together or not at
all (KIP-447: `send_offsets_to_transaction` with the consumer's group metadata), so a worker that
lost its partitions while paused — a zombie — is fenced by the group generation, and a restarted
worker fences its previous incarnation through its stable transactional id. After any abort the
worker rebuilds its state from the changelog and rewinds to the committed offsets: what is in
memory is never ahead of what Kafka committed.

With `--standby all` a worker also keeps warm copies of the partitions it does not own
(`detector.runtime.standby`), and restores a partition it gains from where its copy stands. A
partition it gives up in a rebalance stays warm from where its own restore and commits left its
store, which the worker knows without asking the broker.

`--processing-guarantee at-least-once` runs the same loop without transactions: a commit flushes
the batch and then commits the offsets (`detector.runtime.output`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from detector import gc_tuning
from detector.core import Detector
from detector.errors import ExitCode, SplitbrainError
from detector.kafka.config import error_of
from detector.kafka.health import TRANSACTION_TOPICS, serves
from detector.kafka.stateful.rebalance import subscribe
from detector.kafka.stateful.recovery import StateRestore
from detector.kafka.stateful.topics import TopologyError, ensure_state_topic
from detector.runtime.checkpoint import Checkpoint, Record
from detector.runtime.output import open_output
from detector.runtime.processor import PartitionProcessor, Writes
from detector.runtime.settings import WorkerSettings
from detector.runtime.stall import StallWatch
from detector.runtime.standby import Standby, WarmCopy
from detector.runtime.store import Store, open_store
from detector.runtime.topology import inspect_topics
from detector.telemetry.metrics import WorkerMetrics
from detector.telemetry.tracing import ProcessingSpans, WorkerTracing

log = logging.getLogger(__name__)

_BATCH: Final = 500
_POLL_S: Final = 0.05
# The broker recompresses the changelog's lz4 batches with zstd: a workflow's whole state per
# transaction that touched it takes 0.21 bytes per input byte with zstd, 0.26 with zlib and more
# with lz4 (docs/benchmarks.md, issue 22). Only the worker reads the changelog back, so the
# producer, whose findings any client reads, keeps lz4. Level 6 rather than the broker's 3:
# about a tenth smaller again for the broker's compression work (brokers from Kafka 3.8 take
# the level, KIP-390; an older one is given the topic without it).
CHANGELOG_CONFIG: Final = {
    "cleanup.policy": "compact",
    "compression.type": "zstd",
    "compression.zstd.level": "6",
}
_BEFORE_KAFKA_3_8: Final = {k: v for k, v in CHANGELOG_CONFIG.items() if "level" not in k}


class FencedError(SplitbrainError):
    """Another instance owns our transactional id or our partitions: this process must stop."""


@dataclass(slots=True)
class PartitionState:
    """One input partition's store and processor. `position`: the changelog offset up to which
    the store holds every committed state, as this worker learned it: where its restore ended,
    then after its own last state record in a committed transaction (kept up with a standby
    only). Never the changelog's end as the broker tells it later: by then another member may
    have written there, if this one stalled out of the group mid-rebalance."""

    store: Store
    processor: PartitionProcessor
    position: int = OFFSET_BEGINNING


class KafkaLoopWorker:
    def __init__(
        self,
        settings: WorkerSettings,
        metrics: WorkerMetrics,
        tracing: WorkerTracing | None = None,
        engine: type[Detector] = Detector,
    ) -> None:
        self.s = settings
        self.engine = engine  # the class of each partition's engine
        self.metrics = metrics
        self.tracing = tracing or WorkerTracing.off()
        self.partitions: dict[int, PartitionState] = {}
        self.stopping = False
        self.checkpoint = Checkpoint.of(settings, metrics)
        self.freeze = gc_tuning.Freezer()
        self.admin = AdminClient(settings.kafka)
        self.stall = StallWatch(
            give_up_s=settings.commit_give_up_s, give_up=_exit_stuck, serving=self._serving
        )
        self.consumer = Consumer(
            {
                **settings.kafka,
                "error_cb": self.stall.kafka_error,
                "group.id": settings.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 2000,
                "max.poll.interval.ms": 60000,
                "partition.assignment.strategy": "range",
            }
        )
        self.output = open_output(settings, self.consumer)
        self.restore = StateRestore(
            settings.kafka,
            settings.changelog_topic,
            group_id=f"{settings.group_id}-restore",
            on_error=self.stall.kafka_error,  # a restore can wait out an outage too
        )
        self.input_partitions = range(0)  # known once the topics are inspected
        self.standby = (
            None
            if settings.standby == "off"
            else Standby(
                settings.kafka,
                settings.changelog_topic,
                group_id=f"{settings.group_id}-standby",
                open_store=self._open_store,
                metrics=metrics,
                on_error=self.stall.kafka_error,
            )
        )

    # ---- lifecycle ----------------------------------------------------------------------------

    def run(self) -> int:
        """Process until SIGTERM/SIGINT; 0 on a clean stop, 3 when fenced by a newer owner."""
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        try:
            partitions, _ = inspect_topics(self.admin, self.s)
            self.input_partitions = range(partitions)
            ensure_state_topic(
                self.admin,
                self.s.input_topic,
                "input",
                self.s.changelog_topic,
                CHANGELOG_CONFIG,
                older=_BEFORE_KAFKA_3_8,
            )
            self.output.start()
        except TopologyError as exc:
            log.error("cannot start the worker: %s", exc)
            return ExitCode.UNUSABLE
        except KafkaException as exc:
            if not _refused_timeout(exc):
                raise
            log.error(
                "cannot start the worker: the brokers refuse --transaction-timeout-ms "
                "(SPLITBRAIN_TRANSACTION_TIMEOUT_MS) %d, above their transaction.max.timeout.ms: "
                "%s",
                self.s.transaction_timeout_ms,
                exc,
            )
            return ExitCode.UNUSABLE
        subscribe(self.consumer, self.s.input_topic, self)
        log.info("worker %s started, group %s", self.s.instance_id, self.s.group_id)
        self.metrics.polled(time.time())
        self.stall.start(assigned=lambda: bool(self.partitions))
        try:
            while not self.stopping:
                self._step()
            self._commit()
        except FencedError as exc:
            log.error("fenced, stopping without committing: %s", exc)
            return ExitCode.FENCED
        except KafkaException as exc:
            # Stopping with the cluster unreachable: what is not committed is redone by the
            # partitions' next owner, from the committed offsets and state.
            log.error("stopping without committing the last transaction: %s", exc)
            return ExitCode.FAILED
        finally:
            self.consumer.close()
            if self.standby is not None:
                self.standby.close()
        log.info("worker %s stopped cleanly", self.s.instance_id)
        return ExitCode.OK

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _serving(self) -> bool:
        """Whether the cluster serves every partition a transaction of this worker writes to
        (the stall watch asks, from its thread, while a commit is past its timeout)."""
        s = self.s
        topics = (s.findings_topic, s.dlq_topic, s.changelog_topic, *TRANSACTION_TOPICS)
        return serves(self.admin, topics)

    # ---- the loop -----------------------------------------------------------------------------

    def _step(self) -> None:
        standby = self.standby
        # A standby with more to read does not wait on a quiet input.
        wait = 0.0 if standby is not None and standby.behind else _POLL_S
        messages = self._poll(wait)
        self.metrics.polled(time.time())
        checkpoint = self.checkpoint
        if not messages and checkpoint.opened_at is None and self.partitions:
            self.stall.progressed()  # idle, holding partitions: nothing waits for Kafka
        spans = self.tracing.batch()
        try:
            for msg in messages:
                if self.stopping:
                    break
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                topic, partition, offset = _coordinates(msg)
                ps = self.partitions.get(partition)
                if ps is None:
                    continue  # revoked while the batch was in flight
                self._begin()
                self._process(msg, topic, partition, offset, ps, spans)
            self._tick(time.time())
            if checkpoint.due(self.s.commit_max_events, self.s.commit_interval_ms):
                self._commit()
        except KafkaException as exc:
            self._recover(exc)
        finally:
            spans.end()
        if standby is not None:  # outside the transaction: its errors are not the batch's
            standby.poll()

    def _poll(self, wait: float) -> list[Message]:
        """What has arrived, at once; on a quiet input, the first record to come within `wait`
        (the next step takes what came with it).

        confluent-kafka's `consume` returns once it has its whole batch or its timeout passed:
        below full load it held every batch, and the commit due after it, until then. Each
        call's records are processed before the next call, which may run a rebalance callback.
        """
        messages = self.consumer.consume(num_messages=_BATCH, timeout=0)
        if messages or wait <= 0:
            return messages
        return self.consumer.consume(num_messages=1, timeout=wait)

    def _begin(self) -> None:
        if self.checkpoint.opened_at is None:
            self.output.begin()
            self.checkpoint.begin()

    def _process(
        self,
        msg: Message,
        topic: str,
        partition: int,
        offset: int,
        ps: PartitionState,
        spans: ProcessingSpans,
    ) -> None:
        headers = msg.headers()
        spans.add(partition, headers)
        writes = ps.processor.process(msg.key(), msg.value(), topic, offset, time.time(), headers)
        self.checkpoint.consumed(topic, partition, offset)
        self._write(writes, ps)

    def _write(self, writes: Writes, ps: PartitionState) -> None:
        """Into the open transaction; the states at its commit."""
        for record in self.checkpoint.take(ps.processor, ps.store, writes):
            self.output.produce(record)

    def _tick(self, now: float) -> None:
        """Let time pass in every partition whose tick is due; evictions become tombstones."""
        for partition, ps in self.partitions.items():
            writes = ps.processor.tick(now)
            if writes is None:
                continue
            if writes.findings or writes.changed:
                self._begin()
                self._write(writes, ps)
            self.metrics.consumer_lag(partition, self._lag(partition))

    def _lag(self, partition: int) -> int | None:
        """From the high watermark the last fetch reported (no broker round trip): None until
        there was one. With transactional producers on the input, it also counts their commit
        markers and open transactions."""
        tp = TopicPartition(self.s.input_topic, partition)
        try:
            _, end = self.consumer.get_watermark_offsets(tp, cached=True)
            position = self.checkpoint.offsets.get((tp.topic, partition))
            if position is None:  # nothing processed since the assignment: where the fetch is
                position = self.consumer.position([tp])[0].offset
        except KafkaException:  # a metric must never abort the transaction (see _step)
            return None
        return None if end < 0 or position < 0 else end - position

    def _commit(self) -> None:
        """The open batch: its output, then the states that record it, then its offsets. The
        histogram times the waits for the broker, not the encoding of the states."""
        checkpoint = self.checkpoint
        if checkpoint.opened_at is None:
            return
        started = time.monotonic()
        self.output.deliver()
        delivering = time.monotonic() - started
        written = self._produce_states(checkpoint.states())
        offsets = [TopicPartition(t, p, offset) for (t, p), offset in checkpoint.offsets.items()]
        started = time.monotonic()
        self.stall.committing(True)
        try:
            self.output.commit(offsets)
        finally:
            self.stall.committing(False)
        self.stall.progressed()
        checkpoint.committed(delivering + time.monotonic() - started)
        for p, ps in self.partitions.items():
            ps.store.committed()
            ps.position = max(ps.position, written.get(p, OFFSET_BEGINNING))
        self.freeze(time.monotonic())  # what the commit leaves is the states: long-lived

    def _produce_states(self, records: list[Record]) -> dict[int, int]:
        """Into the open transaction. With a standby, the returned mapping fills, as deliveries
        are reported (before the commit returns), with the offset after each changelog
        partition's last record: one delivery report per partition and transaction."""
        written: dict[int, int] = {}
        if self.standby is None:
            for record in records:
                self.output.produce(record)
            return written

        def delivered(err: KafkaError | None, msg: Message) -> None:
            partition, offset = msg.partition(), msg.offset()
            if err is None and partition is not None and offset is not None:
                written[partition] = offset + 1

        last = {record.partition: i for i, record in enumerate(records)}
        for i, record in enumerate(records):
            self.output.produce(record, delivered if last[record.partition] == i else None)
        return written

    # ---- failure and rebalance ----------------------------------------------------------------

    def _recover(self, exc: KafkaException) -> None:
        """Abort, then make memory match Kafka again: state from the changelog, offsets rewound."""
        if _fatal(exc):
            self._renew_producer(exc, fenced=True)
        log.warning("transaction failed, aborting and rebuilding: %s", exc)
        self.stall.kafka_error(exc)
        opened = self.checkpoint.opened_at is not None
        self.checkpoint.aborted()
        if opened:
            try:
                self.output.abort()
            except KafkaException as abort_exc:
                # Fenced, or the coordinator unreachable, or a commit that timed out still in
                # progress (librdkafka then refuses the abort: only that commit can resume).
                self._renew_producer(abort_exc, fenced=_fatal(abort_exc))
            else:
                if _timed_out(exc) and self.output.renews_after_timeout:
                    self._renew_producer(exc, fenced=False)
        self._restore(list(self.partitions), rewind=True)

    def _renew_producer(self, exc: KafkaException, *, fenced: bool) -> None:
        """A producer that cannot end its transaction is replaced, if `Output.renew` finds that
        no other instance fenced it (else stop: `FencedError`), and the new one started as soon
        as the transaction coordinator answers. The open transaction ends with the old one."""
        if not self.output.renew(fenced=fenced):
            raise FencedError(str(exc))
        log.warning("a new producer takes over the transactional id: %s", exc)
        self.checkpoint.end()
        while not self.stopping:
            try:
                self.output.start()
                return
            except KafkaException as start_exc:
                if _fatal(start_exc):
                    raise FencedError(str(start_exc)) from None
                self.stall.kafka_error(start_exc)
                log.warning("a new producer cannot start yet (%s); trying again", start_exc)

    def partitions_assigned(self, partitions: list[int]) -> None:
        # The assignment itself starts at the committed offsets; only the state needs loading.
        self._abort_quietly()
        self._restore(partitions, rewind=False)
        if self.standby is not None:
            self.standby.track(set(self.input_partitions) - set(partitions))

    def partitions_revoked(self, partitions: list[int]) -> None:
        # In a transaction, uncommitted work is discarded: the next owner resumes from the
        # committed offsets with the committed state. At least once, it is committed if it can
        # be, or the next owner writes it again. With standbys it is committed in a transaction
        # too, as Kafka Streams does, so that every revoked partition's store is its changelog's
        # and stays warm (a busy worker's open transaction has changed them all). The commit
        # fails if this worker is no longer in the group's generation (a stall past its session
        # in this callback hands the partitions on before it returns), and a next owner that
        # starts before the commit ends waits for it (its restore reads past undecided
        # transactions to the high watermark, and a read_committed consumer's committed offsets
        # are fetched stable, KIP-447).
        untouched = [p for p in partitions if not self.checkpoint.touched(p)]
        if self.output.commits_on_revoke or self.standby is not None:
            try:
                self._commit()
            except KafkaException as exc:
                log.warning("commit during rebalance failed: %s", exc)
        self._drop(
            partitions,
            self._kept_warm(partitions if self.checkpoint.opened_at is None else untouched),
        )

    def partitions_lost(self, partitions: list[int]) -> None:
        # The next owner may be restoring them already: uncommitted work is discarded in both
        # modes, neither its states nor its offsets written (at least once, its output already
        # in flight lands, and the next owner writes it again).
        log.warning("partitions %s lost: their uncommitted work is dropped", sorted(partitions))
        self._drop(partitions)

    def _drop(self, partitions: list[int], warm: dict[int, WarmCopy] | None = None) -> None:
        """Partitions no longer ours: their stores closed, or those in `warm` kept as standbys."""
        self._abort_quietly()
        self.checkpoint.forget((self.s.input_topic, p) for p in partitions)
        warm = warm or {}
        for partition in partitions:
            gone = self.partitions.pop(partition, None)
            if gone is not None and partition not in warm:
                gone.store.close()
            self.metrics.partition_gone(partition)
        if self.standby is not None and warm:
            self.standby.keep(warm)

    def _kept_warm(self, clean: list[int]) -> dict[int, WarmCopy]:
        """The stores of revoked partitions that hold no uncommitted change (`clean`), as warm
        copies from their `position`: whatever a next owner writes lies past this worker's last
        committed record, so the copy reads it, even one written while this worker stalled in
        the revocation. Nothing without a standby, or when stopping (the consumer's close
        revokes every partition)."""
        if self.standby is None or self.stopping:
            return {}
        held = {p: self.partitions[p] for p in clean if p in self.partitions}
        return {p: WarmCopy(ps.store, ps.position) for p, ps in held.items()}

    def _abort_quietly(self) -> None:
        if self.checkpoint.opened_at is None:
            return
        try:
            self.output.abort()
        except KafkaException as exc:
            log.warning("abort during rebalance failed: %s", exc)
        self.checkpoint.aborted()

    def _restore(self, partitions: list[int], *, rewind: bool) -> None:
        """Read each partition's changelog to its end (read_committed) before processing it: from
        the beginning, or from where its standby's copy stands."""
        started = time.monotonic()
        self.checkpoint.forget((self.s.input_topic, p) for p in partitions)
        for p in partitions:
            old = self.partitions.pop(p, None)
            if old is not None:
                old.store.close()
        warm = {} if self.standby is None else self.standby.take(partitions)
        restored = {p: self._fresh(p, warm.get(p)) for p in partitions}
        starts = {p: copy.position for p, copy in warm.items()}
        records = self._read_changelog(restored, starts) if partitions else 0
        if self.stopping:  # the restore may be incomplete: process nothing with it
            for ps in restored.values():
                ps.store.close()
            return
        if partitions and rewind:
            committed = self.consumer.committed(
                [TopicPartition(self.s.input_topic, p) for p in partitions], timeout=30
            )
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                self.consumer.seek(TopicPartition(self.s.input_topic, tp.partition, offset))
        self.partitions.update(restored)
        for p in partitions:
            self.metrics.engine_replaced(p)
        elapsed = time.monotonic() - started
        self.metrics.restored(elapsed, records)
        log.info(
            "restored partitions %s in %.2fs: %d changelog records%s",
            sorted(partitions),
            elapsed,
            records,
            f", standbys' from offsets {starts}" if starts else "",
        )

    def _open_store(self, partition: int) -> Store:
        return open_store(self.s.store, self.s.state_dir / self.s.instance_id, partition)

    def _fresh(self, partition: int, warm: WarmCopy | None = None) -> PartitionState:
        """A partition's engine over its standby's store, caught up by the restore, or over an
        empty one."""
        store = self._open_store(partition) if warm is None else warm.store
        detector = self.engine(config=self.s.engine, states=store.states)
        processor = PartitionProcessor(
            partition, detector, self.metrics, tracing=self.tracing.partition(partition)
        )
        return PartitionState(store, processor)

    def _read_changelog(self, restored: dict[int, PartitionState], starts: dict[int, int]) -> int:
        """Each partition's states, from `starts` (default: the beginning) up to the changelog's
        high watermark (`StateRestore`), and the `position` of the end reached; the number of
        records read. A record loaded past that end (none is committed there while the worker
        restores) leaves the position short of the store, which costs a copy a record read
        again, never one skipped."""
        read = 0
        reached: dict[int, int] = {}
        for partition, _, key, value in self.restore.read(
            restored, lambda: self.stopping, starts, reached
        ):
            restored[partition].store.load(key.decode(), value)
            read += 1
        for partition, end in reached.items():
            restored[partition].position = end
        return read


def _exit_stuck() -> None:
    """The process ends at once: the loop is blocked inside the client, past any clean stop."""
    logging.shutdown()
    os._exit(ExitCode.FAILED)


def _fatal(exc: KafkaException) -> bool:
    """Whether the error leaves the producer unusable (fenced, or a fatal transactional one)."""
    err = error_of(exc)
    return err is not None and (err.fatal() or err.code() == KafkaError._FENCED)


def _refused_timeout(exc: KafkaException) -> bool:
    """Whether the brokers refused the transaction timeout: above their maximum."""
    err = error_of(exc)
    return err is not None and err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def _timed_out(exc: KafkaException) -> bool:
    """Whether the client gave up waiting for the broker (not a broker's refusal)."""
    err = error_of(exc)
    return err is not None and err.code() == KafkaError._TIMED_OUT


def _coordinates(msg: Message) -> tuple[str, int, int]:
    """Topic, partition and offset of a fetched record (never absent on one)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def run_kafka_loop(
    settings: WorkerSettings,
    metrics: WorkerMetrics,
    engine: type[Detector] = Detector,
    loop: type[KafkaLoopWorker] | None = None,  # a test's stalls: testing.stalling_worker
) -> int:
    tracing = WorkerTracing.from_env(
        topic=settings.input_topic, group=settings.group_id, instance=settings.instance_id
    )
    try:
        return (loop or KafkaLoopWorker)(settings, metrics, tracing, engine).run()
    finally:
        tracing.shutdown()  # export the spans still buffered
