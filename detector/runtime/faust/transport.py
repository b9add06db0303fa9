"""faust's transport, with the subclasses that keep every send and commit inside the transaction
of the input partition it belongs to."""

from __future__ import annotations

import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Mapping
from typing import Any, cast

import faust
from faust.exceptions import ProducerSendError
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, HeadersArg, Message, RecordMetadata
from faust.types.transports import TransportT
from mode.threads import ServiceThread, WorkerThread
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from detector.runtime.faust.barrier import CommitBarrier
from detector.telemetry.metrics import WorkerMetrics


def commit_barrier(app: Any) -> CommitBarrier:
    return cast(SplitbrainApp, app).barrier


class EosTransactionManager(TransactionManager):
    """Sends only inside a transaction, and into the right one.

    faust's `send` (transport/consumer.py, TransactionManager.send) picks the transactional id
    from `consumer.key_partition(topic, ...)`, which only knows topics the consumer subscribes
    to; for any other topic it silently uses the non-transactional producer (faust #177). Our
    outputs (findings, dead letters and the changelog) are co-partitioned with the input: they
    go to the partition their input record came from, in the transaction of that partition.
    """

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: HeadersArg | None,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        app = cast(SplitbrainApp, self.app)
        source = app.copartitioned_outputs.get(topic)
        if source is None:
            raise ProducerSendError(
                f"refusing to send to {topic!r}: it is not one of this worker's outputs, and "
                "faust would send it outside the transaction (faust #177)"
            )
        if partition is None:
            raise ProducerSendError(f"refusing to send to {topic!r} without its partition")
        group = app.assignor.group_for_topic(source)
        tid = f"{app.conf.id}-{group}-{partition}"
        return await self.producer.send(
            topic, key, value, partition, timestamp, headers, transactional_id=tid
        )

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """faust's `commit` logs ProducerFenced and returns True as if it had committed; here any
        failure marks the worker unusable and propagates, so faust's bookkeeping never records a
        commit that did not happen."""
        by_tid: dict[str, dict[TP, int]] = {}
        for tp, offset in offsets.items():
            group = self.app.assignor.group_for_topic(tp.topic)
            by_tid.setdefault(f"{self.app.conf.id}-{group}-{tp.partition}", {})[tp] = offset
        if not by_tid:
            return True
        app = cast(SplitbrainApp, self.app)
        started = time.monotonic()
        try:
            await self.producer.commit_transactions(
                by_tid, self.app.conf.id, start_new_transaction=start_new_transaction
            )
        except BaseException as exc:
            app.barrier.fail(exc)
            app.barrier.checkpoint.aborted()  # Kafka aborts what this worker can no longer commit
            raise
        app.barrier.checkpoint.committed(
            time.monotonic() - started, {tp.partition for tp in offsets}
        )
        return True


class DaemonWorkerThread(WorkerThread):
    """The OS thread under a mode `ServiceThread`, as a daemon.

    mode's `WorkerThread.__init__` sets `daemon = False`, and a `ServiceThread` is a mode
    Service, not a `threading.Thread`: a `daemon` flag on the service changes nothing. After a
    crash the main thread then waits in `threading._shutdown` for the consumer thread, whose
    event loop may never end: the worker stays alive and silent, so no supervisor restarts it.
    """

    def __init__(self, service: ServiceThread, **kwargs: Any) -> None:
        super().__init__(service, **kwargs)
        self.daemon = True


class EosConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Recovery reads the changelog up to the last stable offset the broker reports.

    faust's `_highwaters` (transport/drivers/aiokafka.py) returns aiokafka's cached
    `last_stable_offset(tp)` in exactly-once mode; that is None for a partition not fetched yet,
    which recovery turns into "empty changelog" and skips restoring the table (faust #158). With
    `isolation_level=read_committed`, ListOffsets(latest) answers with the LSO itself.

    Its thread is a daemon (`DaemonWorkerThread`): mode makes it a non-daemon one, which after a
    crash (a fenced producer, say) outlives the closed event loop and keeps the process from
    exiting, so no supervisor ever restarts it. A graceful stop still stops and joins it first.
    """

    Worker = DaemonWorkerThread

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        consumer = self._ensure_consumer()
        return cast(Mapping[TP, int], await consumer.end_offsets(partitions))

    seek_epoch = 0  # how many seeks to committed so far: a fetch is stale once this moved on

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Mapping[TP, Any]:
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        # Read on the consumer thread with no await since the fetch: exact against the seeks.
        return FetchedRecords(records, self.seek_epoch)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        return cast(Mapping[TP, int], await self.call_thread(self._seek_to_committed))

    async def _seek_to_committed(self) -> Mapping[TP, int | None]:
        """Every assigned partition to where the group committed, as aiokafka's
        `seek_to_committed`, with two changes; runs on the consumer thread.

        An input partition the group committed nothing in starts at its beginning. aiokafka
        seeks only the partitions whose committed offset is above 0 and leaves the others where
        its fetcher got to; the torture run lost the findings of every input partition that had
        changed owner before anything of it was committed.

        `seek_epoch` moves on in the same step as the seeks (no await in between), so each
        fetched batch is known to come from before or after them (`EosConsumer.is_stale`).
        """
        consumer = self._ensure_consumer()
        input_topic = cast(SplitbrainApp, self.app).input_topic
        committed: dict[TP, int | None] = {}
        for tp in consumer.assignment():
            committed[tp] = await consumer.committed(tp)
        fresh = [
            tp
            for tp, offset in committed.items()
            if tp.topic == input_topic and (offset is None or offset <= 0)
        ]
        self.seek_epoch += 1
        for tp, offset in committed.items():
            if offset is not None and offset > 0:
                consumer.seek(tp, offset)
        if fresh:
            # Its first step (before any await) asks the fetcher to reset them.
            await consumer.seek_to_beginning(*fresh)
        return committed


class FetchedRecords(dict[TP, Any]):
    """One fetch's records, and the `seek_epoch` they were fetched in."""

    def __init__(self, records: Mapping[TP, Any], seek_epoch: int) -> None:
        super().__init__(records)
        self.seek_epoch = seek_epoch


class InputReadOffsets(defaultdict[TP, int | None]):
    """faust's read offsets, which its fetch loop never sees for the input topic.

    The loop drops every record below the read offset and counts a jump above it as a gap that
    needs no ack. A seek resets the read offset, but records fetched before it keep arriving
    and move it back up, so the records fetched again after the seek were dropped: a hole in
    the partition that no ack ever filled. For the input topic the agent skips what was
    fetched before a seek (`EosConsumer.is_stale`) and the commit uses what it processed, so
    the loop delivers everything.
    """

    def __init__(self, input_topic: str) -> None:
        super().__init__(lambda: None)
        self.input_topic = input_topic

    def __getitem__(self, tp: TP) -> int | None:
        return None if tp.topic == self.input_topic else super().__getitem__(tp)


class EosConsumer(faust_aiokafka.Consumer):
    """Commits only at event boundaries, only what was processed, only after it was delivered."""

    _thread: EosConsumerThread

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_offset = InputReadOffsets(cast(SplitbrainApp, self.app).input_topic)
        self._fetched_in: weakref.WeakKeyDictionary[Message, int] = weakref.WeakKeyDictionary()
        self._batch_epoch = 0

    def _new_consumer_thread(self) -> EosConsumerThread:
        return EosConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _getmany(self, active_partitions: set[TP] | None, timeout: float) -> Any:
        records = await super()._getmany(active_partitions, timeout)
        self._batch_epoch = getattr(records, "seek_epoch", self._batch_epoch)
        return records

    def _to_message(self, tp: TP, record: Any) -> Any:
        message = super()._to_message(tp, record)  # called while its batch is delivered
        if tp.topic == cast(SplitbrainApp, self.app).input_topic:
            self._fetched_in[message] = self._batch_epoch
        return message

    def is_stale(self, message: Message) -> bool:
        """Whether the message was fetched before the last seek to the committed offsets.

        faust seeks after every recovery while its fetch loop keeps delivering, and the fetcher
        may have been ahead of the committed offset: a stale record is fetched again after the
        seek, and processing it first would process its partition out of order.
        """
        epoch = self._fetched_in.get(message)
        return epoch is not None and epoch != self._thread.seek_epoch

    def _new_offset(self, tp: TP) -> int | None:
        """For the input topic: the offset after the last event the agent finished.

        faust commits the first run of consecutive acked offsets, and only once that run
        starts next to the committed offset; a hole there (a record dropped or skipped) stopped
        the partition's commits for good, silently. The agent processes each partition in
        order from the last seek, so what it finished is what to commit.
        """
        if tp.topic != cast(SplitbrainApp, self.app).input_topic:
            return super()._new_offset(tp)
        self._acked[tp].clear()
        self._acked_index[tp].clear()
        self._gap.pop(tp, None)
        return commit_barrier(self.app).checkpoint.offsets.get((tp.topic, tp.partition))

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        barrier = commit_barrier(self.app)
        async with barrier.lock:
            barrier.check_usable()
            await barrier.drain()
            return cast(
                bool,
                await super().force_commit(topics, start_new_transaction=start_new_transaction),
            )

    async def _commit_offsets(
        self, offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        commit_barrier(self.app).check_offsets(offsets)
        return await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        # Not `Checkpoint.forget`: a partition that stays keeps its open transaction, and with it
        # what the agent finished (`FaustWorker._on_assignment` forgets the ones that moved).
        commit_barrier(self.app).checkpoint.revoked(tp.partition for tp in revoked)
        await super().on_partitions_revoked(revoked)


class EosTransport(faust_aiokafka.Transport):
    Consumer = EosConsumer
    TransactionManager = EosTransactionManager


class KeptWhileFlowing(FlowControlEvent):
    """Flow control whose resume clears the stream queues only after a suspension.

    mode's `resume` clears them every time. faust resumes twice in a recovery: when it starts
    reading the changelog (the flow was suspended for the rebalance) and again at its end, after
    it resumed the input partitions and while it seeks them to the committed offsets. A record
    fetched after that seek and queued before the second resume was dropped there, with the
    consumer's position already past it: the partition went on without it, the event never
    judged. What was queued before the seek is skipped by `EosConsumer.is_stale` and fetched
    again.
    """

    def resume(self) -> None:
        if not self.is_active():
            super().resume()


class SplitbrainApp(faust.App):
    """A faust App on `EosTransport`, carrying the state the subclasses above share."""

    barrier: CommitBarrier
    kafka_config: dict[str, Any]  # librdkafka's: the high watermarks recovery waits for
    input_topic: str
    copartitioned_outputs: dict[str, str]
    metrics: WorkerMetrics

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return KeptWhileFlowing(loop=self.loop)

    def _new_transport(self) -> TransportT:
        return EosTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> TransportT:
        return EosTransport(self.conf.broker_producer, self)
