"""The faust runtime's input offsets, with no broker: a seek after recovery never leaves a
partition with a hole that stops its commits, and never has it processed out of order.

The CI stall (ADR 0003, "A partition can stall"): faust's fetch loop drops every record below
its read offset; after the seek at the end of a recovery, records fetched before the seek kept
arriving, moved the read offset back up, and the records fetched again were dropped. faust then
never committed the partition again (its commit needs consecutive acks from the committed
offset), while the worker went on processing into a transaction nobody committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from faust.types import TP, Message
from prometheus_client import CollectorRegistry

from detector.runtime.faust.transport import EosConsumer, FetchedRecords
from detector.runtime.faust.worker import FaustWorker
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.offline import INPUT, offline_settings

P0 = TP(INPUT, 0)


def worker(tmp_path: Path) -> FaustWorker:
    return FaustWorker(
        offline_settings(tmp_path),
        partitions=1,
        replication=1,
        credentials=None,
        metrics=WorkerMetrics(CollectorRegistry()),
    )


@dataclass(frozen=True)
class Record:
    """What faust's aiokafka driver reads of a fetched record."""

    offset: int
    topic: str = INPUT
    partition: int = 0
    timestamp: int = 0
    timestamp_type: int = 0
    key: bytes = b"k"
    value: bytes = b"v"
    checksum: None = None
    serialized_key_size: int = 1
    serialized_value_size: int = 1
    headers: tuple[()] = ()


def test_a_hole_in_fausts_acks_no_longer_stops_the_partitions_commits(tmp_path: Path) -> None:
    """What a stalled worker held (torture run, 2026-12-01): committed 2378, acks for
    2386..3301, every event processed. faust's own choice is to commit nothing, forever."""

    async def scenario() -> None:
        w = worker(tmp_path)
        consumer = w.app.consumer
        assert isinstance(consumer, EosConsumer)
        consumer._committed_offset[P0] = 2378
        consumer._acked[P0].extend(range(2386, 3302))
        w.app.barrier.checkpoint.offsets[(INPUT, 0)] = 3302
        assert super(EosConsumer, consumer)._new_offset(P0) is None  # stock faust: stuck
        consumer._acked[P0].extend(range(2386, 3302))
        assert consumer._filter_committable_offsets([P0]) == {P0: 3302}

    asyncio.run(scenario())


def test_records_fetched_before_a_seek_never_shadow_the_records_fetched_again(
    tmp_path: Path,
) -> None:
    """faust's own fetch loop (`Consumer._drain_messages`) over three fetches: a batch from
    where the fetcher had got to (695..), during which recovery seeks the partition back to its
    beginning (nothing committed yet), then the records from the beginning. The agent must see
    0, 1, 2, ... in order; stock faust delivered 695..704 and dropped 0..9 as already read."""

    async def scenario() -> list[int]:
        w = worker(tmp_path)
        consumer = w.app.consumer
        assert isinstance(consumer, EosConsumer)
        thread = consumer._thread
        fetches: Iterator[list[int]] = iter([list(range(695, 705)), list(range(10))])

        async def fetch(
            active_partitions: set[TP] | None, timeout: float
        ) -> Mapping[TP, list[Any]]:
            batch = next(fetches, None)
            if batch is None:
                fetcher._stopped.set()
                return FetchedRecords({}, thread.seek_epoch)
            return FetchedRecords({P0: [Record(o) for o in batch]}, thread.seek_epoch)

        async def seek_to_committed() -> Mapping[TP, int]:
            thread.seek_epoch += 1
            return cast(Mapping[TP, int], {P0: None})  # the group committed nothing there

        delivered: list[Message] = []

        async def on_message(message: Message) -> None:
            delivered.append(message)
            if message.offset == 697:  # the recovery's seek, while the batch is delivered
                await consumer.perform_seek()

        thread.getmany = fetch  # type: ignore[method-assign]
        thread.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
        thread.highwater = lambda tp: 705  # type: ignore[method-assign]
        consumer._active_partitions = {P0}
        consumer.callback = on_message
        fetcher = w.app._fetcher
        await asyncio.wait_for(consumer._drain_messages(fetcher), 10)
        return [m.offset for m in delivered if not consumer.is_stale(m)]

    got = asyncio.run(scenario())
    assert got == list(range(10)), got


def test_a_record_fetched_after_the_recoverys_seek_outlives_its_end(tmp_path: Path) -> None:
    """faust's recovery (tables/recovery.py) resumes the flow when it starts reading the
    changelog, then resumes the input partitions, seeks them and resumes the flow again. Stock
    mode empties the agents' queues at every resume: a record fetched after the seek and queued
    before the second resume was dropped with the consumer already past it, and never judged
    (CI, 2026-12-06: the restore test's stale event). Only a resume after a suspension (the
    rebalance) empties them."""

    async def scenario() -> None:
        w = worker(tmp_path)
        flow = w.app.flow_control
        queue = w.app.FlowControlQueue(maxsize=8, clear_on_resume=True)  # as agents have
        queue.put_nowait("fetched before the rebalance")
        flow.resume()  # recovery starts reading the changelog
        assert queue.empty()
        queue.put_nowait("fetched after the seek")
        flow.resume()  # recovery ends
        assert queue.get_nowait() == "fetched after the seek"
        flow.suspend()  # the next rebalance
        queue.put_nowait("fetched before it")
        flow.resume()
        assert queue.empty()

    asyncio.run(scenario())
