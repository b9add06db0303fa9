"""The faust worker: one agent that hands each record to the shared processing step and moves
what its checkpoint makes of it into the transaction of the record's partition."""

from __future__ import annotations

import logging
import re
import ssl
import time
from dataclasses import dataclass
from typing import Final, cast

import faust
from confluent_kafka.admin import AdminClient
from faust.types import TP, Message
from faust.types.auth import CredentialsT
from mode import CrashingSupervisor

from detector.core import Detector
from detector.errors import ExitCode
from detector.kafka.config import KafkaClientError
from detector.kafka.stateful.topics import TopologyError
from detector.runtime.checkpoint import Checkpoint, Record
from detector.runtime.faust.barrier import CommitBarrier, FaustRuntimeError
from detector.runtime.faust.credentials import broker_credentials
from detector.runtime.faust.recovery import EosTableManager
from detector.runtime.faust.table import TABLE_NAME, PartitionStates, StateTable
from detector.runtime.faust.transport import EosConsumer, SplitbrainApp
from detector.runtime.processor import PartitionProcessor
from detector.runtime.settings import WorkerSettings
from detector.runtime.topology import inspect_topics
from detector.telemetry.metrics import WorkerMetrics
from detector.telemetry.tracing import WorkerTracing

log = logging.getLogger(__name__)

REPORT_EVERY_S: Final = 5.0  # wall clock: liveness and lag for the metrics
MAX_PRODUCE_BYTES: Final = 4 * 1024 * 1024


@dataclass(slots=True)
class PartitionEngine:
    processor: PartitionProcessor
    states: PartitionStates

    @property
    def partition(self) -> int:
        return self.processor.partition

    @property
    def detector(self) -> Detector:
        return self.processor.detector


class FaustWorker:
    """Builds the faust app for one worker process; `run` blocks until SIGTERM."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        partitions: int,
        replication: int,
        credentials: CredentialsT | None,
        metrics: WorkerMetrics,
        tracing: WorkerTracing | None = None,
        engine: type[Detector] = Detector,
    ) -> None:
        self.settings = settings
        self.engine = engine  # the class of each partition's engine
        self.metrics = metrics
        self.tracing = tracing or WorkerTracing.off()
        self.engines: dict[int, PartitionEngine] = {}
        app = SplitbrainApp(
            settings.group_id,  # the consumer group, and the prefix of every transactional id
            broker=[
                f"kafka://{server.strip()}"
                for server in str(settings.kafka["bootstrap.servers"]).split(",")
            ],
            broker_credentials=credentials,
            broker_client_id=f"splitbrain-{settings.instance_id}",
            processing_guarantee="exactly_once",
            store="memory://",
            datadir=str(settings.state_dir),
            autodiscover=False,
            web_enabled=False,
            canonical_url=f"http://{_host_label(settings.instance_id)}.splitbrain.invalid",
            table_standby_replicas=0,
            topic_partitions=partitions,
            topic_replication_factor=replication,
            broker_commit_interval=settings.commit_interval_ms / 1000.0,
            broker_commit_every=settings.commit_max_events,
            # As the kafka runtime: a stalled worker loses its partitions within 10 s (faust's
            # default is 60 s, long enough for a paused worker never to become a zombie at all).
            broker_session_timeout=10.0,
            broker_heartbeat_interval=2.0,
            # The DLQ must take the largest record the input accepts, plus its error headers.
            producer_max_request_size=MAX_PRODUCE_BYTES,
            consumer_auto_offset_reset="earliest",
            agent_supervisor=CrashingSupervisor,
            stream_wait_empty=True,
            stream_publish_on_commit=False,
            TableManager=EosTableManager,
        )
        app.barrier = CommitBarrier(Checkpoint.of(settings, metrics))
        app.kafka_config = dict(settings.kafka)
        app.metrics = metrics
        app.input_topic = settings.input_topic
        app.copartitioned_outputs = {
            settings.findings_topic: settings.input_topic,
            settings.dlq_topic: settings.input_topic,
            settings.changelog_topic: settings.input_topic,
        }
        self.app = app
        self.input = app.topic(
            settings.input_topic,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        self.keys_by_partition: dict[int, set[str]] = {}
        self.table = cast(
            StateTable,
            app.tables.add(
                StateTable(
                    app,
                    name=TABLE_NAME,
                    keys=self.keys_by_partition,
                    beacon=app.tables.beacon,
                    partitions=partitions,
                    key_type=bytes,  # bytes: the raw codec, same format as the kafka runtime
                    value_type=bytes,
                    # as topics.yaml does for the other topics (applies when faust creates it)
                    extra_topic_configs={
                        "min.insync.replicas": str(max(1, min(2, replication - 1)))
                    },
                    help="per-workflow detector state (encode_state bytes)",
                )
            ),
        )
        if self.table.changelog_topic.get_topic_name() != settings.changelog_topic:
            raise FaustRuntimeError(
                f"faust would name the changelog {self.table.changelog_topic.get_topic_name()!r}"
                f", the settings say {settings.changelog_topic!r}"
            )
        app.agent(self.input, name="detect", concurrency=1)(self._agent)
        app.timer(interval=REPORT_EVERY_S, name="report")(self._report)
        self.table.on_assignment = self._on_assignment

    # -- the agent -------------------------------------------------------------------------

    async def _agent(self, stream: faust.StreamT[bytes]) -> None:
        barrier = self.app.barrier
        consumer = cast(EosConsumer, self.app.consumer)
        async for event in stream.events():
            async with barrier.lock:
                message = event.message
                if consumer.is_stale(message) or barrier.done(
                    message.topic, message.partition, message.offset
                ):
                    continue  # fetched again after a seek: processed in its order, once
                spans = self.tracing.batch()  # the agent processes one record at a time
                spans.add(event.message.partition, event.message.headers)
                try:
                    await self._handle(event.message)
                except BaseException as exc:
                    # Half of this event may be in the open transaction: never commit it.
                    barrier.fail(exc)
                    raise
                finally:
                    spans.end()

    async def _handle(self, message: Message) -> None:
        """Into the transaction of the event's partition: its dead letter or finding revisions,
        those of the tick it brings, and the states they changed."""
        engine = self._engine(message.partition)
        checkpoint = self.app.barrier.checkpoint
        processor = engine.processor
        now = time.time()
        processed = processor.process(
            message.key, message.value, message.topic, message.offset, now, message.headers
        )
        records = [*checkpoint.take(processor, engine.states, processed)]
        ticked = processor.tick(now)  # only when an event brings a transaction
        if ticked is not None:
            records += checkpoint.take(processor, engine.states, ticked)
        for record in (*records, *checkpoint.states()):
            await self._send(record)
        checkpoint.consumed(message.topic, message.partition, message.offset)

    def _engine(self, partition: int) -> PartitionEngine:
        engine = self.engines.get(partition)
        if engine is None:
            states = PartitionStates(self.table, partition)
            detector = self.engine(config=self.settings.engine, states=states)
            processor = PartitionProcessor(
                partition, detector, self.metrics, tracing=self.tracing.partition(partition)
            )
            engine = self.engines[partition] = PartitionEngine(processor, states)
        return engine

    async def _send(self, record: Record) -> None:
        topic, partition, key, value, headers = record
        raw_headers = (
            None
            if headers is None
            else [(k, v.encode() if isinstance(v, str) else (v or b"")) for k, v in headers]
        )
        transactions = self.app.consumer.transactions
        fut = await transactions.send(topic, key, value, partition, None, raw_headers)
        self.app.barrier.track(fut)

    async def _report(self) -> None:
        """The event loop runs (the last-poll gauge), how far behind each partition is, and the
        open findings of each partition the agent has seen a record of.

        A partition's lag is known once the agent finished a record of it: faust's cached end
        offset (the last stable offset, in exactly-once mode) minus the next one to process.
        """
        self.metrics.polled(time.time())
        for engine in self.engines.values():
            self.metrics.findings_open(engine.partition, engine.detector.open_findings())
        processed = self.app.barrier.checkpoint.offsets
        for tp in self.app.consumer.assignment():
            if tp.topic == self.settings.input_topic:
                try:
                    end = self.app.consumer.highwater(tp)
                except Exception:  # revoked meanwhile: a metric must never crash the worker
                    end = None
                position = processed.get((tp.topic, tp.partition))
                lag = None if end is None or position is None else end - position
                self.metrics.consumer_lag(tp.partition, lag)

    # -- rebalancing -------------------------------------------------------------------------

    def _on_assignment(self, assigned: set[TP]) -> None:
        """Forget the partitions another worker owns now: their state lives on over there, and
        if one comes back it is restored from the changelog, not from a stale local copy. What
        the agent finished in them goes too: their open transactions end with the move."""
        mine = {tp.partition for tp in assigned if tp.topic == self.settings.input_topic}
        checkpoint = self.app.barrier.checkpoint
        checkpoint.forget([tp for tp in checkpoint.offsets if tp[1] not in mine])
        for partition in {*self.engines, *self.keys_by_partition} - mine:
            if self.engines.pop(partition, None) is not None:
                self.metrics.partition_gone(partition)
            for key in self.keys_by_partition.pop(partition, set()):
                self.table.data.pop(key.encode(), None)  # the local copy only: no changelog

    # -- running -----------------------------------------------------------------------------

    def run(self) -> int:
        self.metrics.polled(time.time())
        worker = faust.Worker(
            self.app, loglevel=logging.getLevelName(log.getEffectiveLevel()), quiet=True
        )
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            code = exc.code
            return code if isinstance(code, int) else ExitCode.FAILED
        return ExitCode.OK


def _host_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")[:63] or "worker"


def run_faust_worker(
    settings: WorkerSettings, metrics: WorkerMetrics, engine: type[Detector] = Detector
) -> int:
    """Run the faust worker until SIGTERM: 0 after a graceful stop, 1 after a crash, 2 when the
    cluster or the settings do not allow it to start."""
    if settings.store != "memory":
        log.error("the faust runtime keeps its table in memory (store=%s)", settings.store)
        return ExitCode.UNUSABLE
    tracing = WorkerTracing.from_env(
        topic=settings.input_topic, group=settings.group_id, instance=settings.instance_id
    )
    try:
        try:
            partitions, replication = inspect_topics(AdminClient(dict(settings.kafka)), settings)
            worker = FaustWorker(
                settings,
                partitions=partitions,
                replication=replication,
                credentials=broker_credentials(settings.kafka),
                metrics=metrics,
                tracing=tracing,
                engine=engine,
            )
        except (FaustRuntimeError, TopologyError, KafkaClientError, ssl.SSLError, OSError) as exc:
            log.error("cannot start the faust worker: %s", exc)
            return ExitCode.UNUSABLE
        return worker.run()
    finally:
        tracing.shutdown()  # export the spans still buffered
