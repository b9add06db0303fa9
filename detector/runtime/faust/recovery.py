"""faust's table recovery, made to load every transaction a read_committed reader will see."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Final, cast

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka.admin import AdminClient
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP
from faust.types.transports import ConsumerT

from detector.kafka.offsets import end_offsets
from detector.runtime.faust.barrier import FaustRuntimeError
from detector.runtime.faust.transport import SplitbrainApp

log = logging.getLogger(__name__)

# Well inside the 90 s that faust gives the step (`broker_request_timeout`): past that, faust
# takes the step for a stop and never recovers again.
END_OFFSETS_TIMEOUT_S: Final = 30.0


class EosRecovery(Recovery):
    """Reads the changelog of a partition that moved in past every transaction written to it.

    faust reads an active changelog partition up to its last stable offset (LSO). A transaction
    whose commit the coordinator has acknowledged but not yet marked on the partition (its
    markers are written after the producer's commit returns) is undecided there, exactly like
    an open one: the LSO stops before it, while the committed input offsets already count it.
    The states it wrote would never be loaded, and the next events judged without them.

    For a partition the worker has not restored since it moved in (`unrestored`), recovery
    reads until its reader's position has passed the high watermark seen when recovery began,
    markers included: every transaction below it is decided, and the committed ones are loaded.
    faust's own reading does the waiting (its `detect_aborted_tx` check of the position), so a
    rebalance that restarts recovery starts it again with fresh ends, and nothing of ours keeps
    polling. A previous owner's transactions are decided before recovery begins: it used the same
    transactional id, and faust starts this worker's producer for the partition (its
    InitProducerId waits until they are) before the tables rebalance. What may be left is another
    writer's, such as the confluent-kafka runtime's after a switch of runtime; the coordinator
    ends it at its timeout at the latest.

    A partition the worker kept is not waited on: the transaction open there is its own, which
    only a commit after recovery ends (waiting for it stalled recovery until the coordinator
    aborted it, and the fenced worker crashed). Its table was complete already.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unrestored: set[int] = set()  # input partitions moved in, changelog not read yet
        self._admin: AdminClient | None = None

    async def on_rebalance(
        self,
        assigned: set[TP],
        revoked: set[TP],
        newly_assigned: set[TP],
        generation_id: int = 0,
    ) -> None:
        # A partition still unrestored from an earlier rebalance whose recovery did not finish
        # was never processed here: no transaction of this worker's is open on it.
        app = cast(SplitbrainApp, self.app)
        mine = {tp.partition for tp in assigned if tp.topic == app.input_topic}
        moved_in = {tp.partition for tp in newly_assigned if tp.topic == app.input_topic}
        self.unrestored = (self.unrestored | moved_in) & mine
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def _build_highwaters(
        self, consumer: ConsumerT, tps: set[TP], destination: Counter[TP], title: str
    ) -> None:
        await super()._build_highwaters(consumer, tps, destination, title)
        waited = [tp for tp in tps if tp.partition in self.unrestored]
        if title != "active" or not waited:
            return  # standbys (none here) and kept partitions: to the LSO, as faust reads
        for tp, high in (await self._high_watermarks(waited)).items():
            stable = destination[tp] + 1  # faust keeps the offset of the last record it expects
            if stable < high:
                log.info(
                    "changelog partition %d: a transaction at %d is undecided, waiting for it "
                    "(end %d)",
                    tp.partition,
                    stable,
                    high,
                )
                # Never the offset of a record read (they are all below it): recovery ends once
                # the reader's position is there, past the markers of every transaction below.
                destination[tp] = high

    async def _high_watermarks(self, tps: list[TP]) -> dict[TP, int]:
        if self._admin is None:
            self._admin = AdminClient(dict(cast(SplitbrainApp, self.app).kafka_config))
        ends: dict[TP, int] = {}
        for topic in {tp.topic for tp in tps}:
            partitions = [tp.partition for tp in tps if tp.topic == topic]
            try:
                high = await asyncio.to_thread(
                    end_offsets,
                    self._admin,
                    topic,
                    partitions,
                    IsolationLevel.READ_UNCOMMITTED,
                    END_OFFSETS_TIMEOUT_S,
                )
            except (KafkaException, TimeoutError) as exc:
                # Restoring to the LSO could miss a committed transaction: stop (exit 1), and
                # let the next worker restore instead.
                raise FaustRuntimeError(
                    f"cannot restore {topic}: its high watermarks are unknown ({exc})"
                ) from exc
            ends.update({TP(topic, p): offset for p, offset in high.items()})
        return ends

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        """Before processing resumes: the partitions of this generation are restored (of an
        older one, a newer recovery is on its way and still needs the wait)."""
        if generation_id == self.app.consumer_generation_id:
            self.unrestored -= {tp.partition for tp in self.active_tps}
        await super().on_recovery_completed(generation_id)


class EosTableManager(TableManager):
    """faust's table manager, recovering with `EosRecovery`."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = EosRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
