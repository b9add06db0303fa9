"""faust's transport, with the subclasses that keep every send and commit inside the transaction
of the input partition it belongs to."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from typing import Any, cast

import faust
from faust.exceptions import ProducerSendError
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, HeadersArg, RecordMetadata
from faust.types.transports import TransportT
from mode.threads import ServiceThread, WorkerThread

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
            app.metrics.aborted()  # Kafka aborts what this worker can no longer commit
            raise
        app.metrics.committed(
            time.monotonic() - started, app.barrier.events, {tp.partition for tp in offsets}
        )
        app.barrier.events = 0
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

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """After recovery, every input partition starts where the group committed, or at its
        beginning when the group committed nothing there.

        aiokafka seeks only the partitions whose committed offset is above 0 and leaves the
        others where its fetcher got to. faust drops what is fetched for a partition it holds
        paused during recovery, so those records were never processed, and the next commit
        (past later records) skipped them: the torture run lost the findings of every input
        partition that had changed owner before anything of it was committed."""
        committed = await super().seek_to_committed()
        input_topic = cast(SplitbrainApp, self.app).input_topic
        fresh = [
            tp
            for tp, offset in committed.items()
            if tp.topic == input_topic and (offset is None or offset <= 0)
        ]
        if fresh:
            await self.seek_to_beginning(*fresh)
        return committed


class EosConsumer(faust_aiokafka.Consumer):
    """Commits only at event boundaries, only what was processed, only after it was delivered."""

    def _new_consumer_thread(self) -> EosConsumerThread:
        return EosConsumerThread(self, loop=self.loop, beacon=self.beacon)

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
        # faust drops its acked offsets of these partitions here; drop ours with them.
        commit_barrier(self.app).forget(revoked)
        cast(SplitbrainApp, self.app).metrics.revoked(tp.partition for tp in revoked)
        await super().on_partitions_revoked(revoked)


class EosTransport(faust_aiokafka.Transport):
    Consumer = EosConsumer
    TransactionManager = EosTransactionManager


class SplitbrainApp(faust.App):
    """A faust App on `EosTransport`, carrying the state the subclasses above share."""

    barrier: CommitBarrier
    input_topic: str
    copartitioned_outputs: dict[str, str]
    metrics: WorkerMetrics

    def _new_transport(self) -> TransportT:
        return EosTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> TransportT:
        return EosTransport(self.conf.broker_producer, self)
