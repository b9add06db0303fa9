"""The faust-streaming runtime: one agent, one changelog-backed table, exactly-once output.

faust 0.15.3 + aiokafka 0.14 do not give exactly-once by setting `processing_guarantee` alone
(docs/decisions/0003-faust-runtime-notes.md has the analysis, with file and line). This module
uses faust's own transaction machinery — one transactional producer per input partition, whose
transaction carries the table's changelog writes and the consumed offsets — and closes the
holes that matter for us with small documented subclasses:

- `EosTransactionManager` puts findings and dead letters into the transaction of the input
  partition they came from (faust would send them outside any transaction, #177) and refuses
  every send that would leave a transaction.
- `EosConsumer` commits only between two events, after every write of the events it commits
  has reached the broker (faust's EOS commit does not flush, and it commits in the middle of an
  event), and never past the last event the agent finished (#606).
- `EosConsumerThread` asks the broker for the changelog's last stable offset before recovery
  (faust reads a cached one that is None until the first fetch, and then skips recovery).

Per-workflow state is the engine's `WorkflowState`, stored in the table as `encode_state` bytes
keyed by `workflow_key`, in the same changelog topic and format as the confluent-kafka runtime.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import (
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Final, cast

import faust
from confluent_kafka.admin import AdminClient
from faust.auth import SASLCredentials
from faust.exceptions import ProducerSendError
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT, HeadersArg, Message, RecordMetadata
from faust.types.auth import CredentialsT
from faust.types.transports import TransportT
from mode import CrashingSupervisor

from detector.core import Detector, FindingUpdate, WorkflowState, encode_state
from detector.errors import ExitCode, SplitbrainError
from detector.kafka.config import KafkaClientError
from detector.runtime.processor import Outcome, PartitionProcessor
from detector.runtime.settings import WorkerSettings
from detector.runtime.store import DecodedCache
from detector.runtime.topology import TopologyError, inspect_topics
from detector.telemetry.metrics import WorkerMetrics

log = logging.getLogger(__name__)

TABLE_NAME: Final = "state"  # faust names its changelog "{app id}-state-changelog"
REPORT_EVERY_S: Final = 5.0  # wall clock: liveness and lag for the metrics
DRAIN_TIMEOUT_S: Final = 60.0
MAX_PRODUCE_BYTES: Final = 4 * 1024 * 1024
_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class FaustRuntimeError(SplitbrainError, RuntimeError):
    """The cluster or the settings do not allow this worker to run; the message says why."""


# ------------------------------------------------------------------------- the commit barrier


@dataclass(slots=True)
class CommitBarrier:
    """What makes a faust commit an exactly-once commit for us.

    The agent holds `lock` from the first write of an event until the event is done, and the
    consumer holds it while it commits, so a transaction never ends in the middle of an event.
    `pending` holds the delivery futures of every record written since the last commit; the
    commit waits for all of them, so it cannot leave a changelog write or a finding behind in
    the next transaction. `processed` is the next offset after the last event the agent
    finished, per input partition: the commit may never go past it. Once `failure` is set the
    worker has half-done work in its open transactions and must not commit again.
    """

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: list[asyncio.Future[Any]] = field(default_factory=list)
    processed: dict[tuple[str, int], int] = field(default_factory=dict)
    failure: BaseException | None = None
    events: int = 0  # input records finished since the last commit, for the metrics

    def track(self, fut: Awaitable[Any]) -> None:
        self.pending.append(asyncio.ensure_future(fut))

    def fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc

    def check_usable(self) -> None:
        if self.failure is not None:
            raise FaustRuntimeError(
                f"refusing to commit after a failure ({self.failure!r}): the open transactions "
                "may hold half an event; Kafka aborts them and the next worker redoes it"
            ) from self.failure

    async def drain(self) -> None:
        """Wait until every record written since the last commit is on the broker."""
        pending, self.pending = self.pending, []
        if pending:
            try:
                await asyncio.wait_for(asyncio.gather(*pending), DRAIN_TIMEOUT_S)
            except BaseException as exc:
                self.fail(exc)
                raise

    def check_offsets(self, offsets: Mapping[TP, int]) -> None:
        for tp, offset in offsets.items():
            done = self.processed.get((tp.topic, tp.partition))
            if done is None or offset > done:
                exc = FaustRuntimeError(
                    f"faust wanted to commit {tp.topic}[{tp.partition}] at {offset}, past the "
                    f"last event the agent finished ({done}); refusing (faust #606)"
                )
                self.fail(exc)
                raise exc

    def forget(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            self.processed.pop((tp.topic, tp.partition), None)


def _barrier(app: Any) -> CommitBarrier:
    return cast(SplitbrainApp, app).barrier


# ------------------------------------------------------------------ faust transport subclasses


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


class EosConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Recovery reads the changelog up to the last stable offset the broker reports.

    faust's `_highwaters` (transport/drivers/aiokafka.py) returns aiokafka's cached
    `last_stable_offset(tp)` in exactly-once mode; that is None for a partition not fetched yet,
    which recovery turns into "empty changelog" and skips restoring the table (faust #158). With
    `isolation_level=read_committed`, ListOffsets(latest) answers with the LSO itself.
    """

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        consumer = self._ensure_consumer()
        return cast(Mapping[TP, int], await consumer.end_offsets(partitions))


class EosConsumer(faust_aiokafka.Consumer):
    """Commits only at event boundaries, only what was processed, only after it was delivered."""

    def _new_consumer_thread(self) -> EosConsumerThread:
        return EosConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        barrier = _barrier(self.app)
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
        _barrier(self.app).check_offsets(offsets)
        return await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        # faust drops its acked offsets of these partitions here; drop ours with them.
        _barrier(self.app).forget(revoked)
        cast(SplitbrainApp, self.app).metrics.revoked(tp.partition for tp in revoked)
        await super().on_partitions_revoked(revoked)


class EosTransport(faust_aiokafka.Transport):
    Consumer = EosConsumer
    TransactionManager = EosTransactionManager


class SplitbrainApp(faust.App):
    """A faust App on `EosTransport`, carrying the state the subclasses above share."""

    barrier: CommitBarrier
    copartitioned_outputs: dict[str, str]
    metrics: WorkerMetrics

    def _new_transport(self) -> TransportT:
        return EosTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> TransportT:
        return EosTransport(self.conf.broker_producer, self)


# --------------------------------------------------------------------------- the state table


class StateTable(faust.Table):  # type: ignore[type-arg]
    """The table of `encode_state` bytes; it tells the worker which keys recovery brought in
    (per partition), and hands every changelog write to the commit barrier."""

    def __init__(self, *args: Any, keys: dict[int, set[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys_by_partition: dict[int, set[str]] = {} if keys is None else keys
        self.on_assignment: Callable[[set[TP]], None] | None = None
        self.rebalanced_at: float | None = None

    async def on_rebalance(
        self,
        assigned: set[TP],
        revoked: set[TP],
        newly_assigned: set[TP],
        generation_id: int = 0,
    ) -> None:
        """Before recovery starts: let the worker drop what moved to other workers."""
        self.rebalanced_at = time.monotonic()
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        if self.on_assignment is not None:
            self.on_assignment(assigned)

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        """The table holds its changelog up to the end: processing starts now."""
        await super().on_recovery_completed(active_tps, standby_tps)
        if self.rebalanced_at is not None:
            elapsed = time.monotonic() - self.rebalanced_at
            self.rebalanced_at = None
            cast(SplitbrainApp, self.app).metrics.restored(elapsed)
            # active_tps are changelog partitions, numbered as the input's (co-partitioned)
            restored = sorted(tp.partition for tp in active_tps)
            log.info("restored partitions %s in %.2fs", restored, elapsed)

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        fut = super().send_changelog(*args, **kwargs)
        _barrier(self.app).track(fut)
        return fut

    def apply_changelog_batch(self, batch: Iterable[EventT[Any]]) -> None:
        events = list(batch)
        super().apply_changelog_batch(events)
        for event in events:
            raw_key = event.message.key
            if raw_key is None:
                continue
            keys = self.keys_by_partition.setdefault(event.message.partition, set())
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            if event.message.value is None:
                keys.discard(key)
            else:
                keys.add(key)


class PartitionStates(DecodedCache):
    """One partition's workflows, as the engine wants them: decoded objects, kept decoded.

    The table holds the durable bytes; `write_back` re-encodes a workflow after the engine
    changed it (in place), and a deletion (the engine's eviction) becomes a changelog tombstone
    at once. Writes happen inside the agent, so they go to the event's partition.
    """

    def __init__(self, table: StateTable, partition: int) -> None:
        self._table = table
        self._keys = table.keys_by_partition.setdefault(partition, set())
        self._live: dict[str, WorkflowState] = {}

    def _raw(self, key: str) -> bytes | None:
        return self._table.data.get(key.encode()) if key in self._keys else None

    def __setitem__(self, key: str, state: WorkflowState) -> None:
        self._live[key] = state
        self._keys.add(key)

    def __delitem__(self, key: str) -> None:
        if key not in self._keys:
            raise KeyError(key)
        self._keys.discard(key)
        self._live.pop(key, None)
        raw_key = key.encode()
        if raw_key in self._table.data:
            del self._table[raw_key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def write_back(self, key: str) -> None:
        state = self._live.get(key)
        if state is None:
            return
        raw = encode_state(state)
        raw_key = key.encode()
        if self._table.data.get(raw_key) != raw:
            self._table[raw_key] = raw


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


# ----------------------------------------------------------------------------- the worker


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
    ) -> None:
        self.settings = settings
        self.metrics = metrics
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
        )
        app.barrier = CommitBarrier()
        app.metrics = metrics
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
        async for event in stream.events():
            async with barrier.lock:
                try:
                    await self._handle(event.message)
                except BaseException as exc:
                    # Half of this event may be in the open transaction: never commit it.
                    barrier.fail(exc)
                    raise

    async def _handle(self, message: Message) -> None:
        engine = self._engine(message.partition)
        now = time.time()
        processed = engine.processor.process(
            message.key, message.value, message.topic, message.offset, now
        )
        await self._write(engine, processed)
        ticked = engine.processor.tick(now)  # only when an event brings a transaction
        if ticked is not None:
            await self._write(engine, ticked)
        self.app.barrier.processed[(message.topic, message.partition)] = message.offset + 1
        self.app.barrier.events += 1

    async def _write(self, engine: PartitionEngine, outcome: Outcome) -> None:
        """Into the transaction of the event's partition: states (evictions were deleted
        through `PartitionStates` already), dead letters and finding revisions."""
        partition = engine.partition
        for key in outcome.changed:
            engine.states.write_back(key)
        dead = outcome.dead_letter
        if dead is not None:
            await self._send(
                self.settings.dlq_topic, dead.key, dead.value, partition, dead.headers()
            )
        for update in outcome.findings:
            await self._publish(update, partition)

    def _engine(self, partition: int) -> PartitionEngine:
        engine = self.engines.get(partition)
        if engine is None:
            states = PartitionStates(self.table, partition)
            detector = Detector(config=self.settings.engine, states=states)
            processor = PartitionProcessor(partition, detector, self.metrics)
            engine = self.engines[partition] = PartitionEngine(processor, states)
        return engine

    async def _publish(self, update: FindingUpdate, partition: int) -> None:
        finding = update.finding
        await self._send(
            self.settings.findings_topic,
            finding.workflow_key.encode(),
            finding.to_json().encode(),
            partition,
            None,
        )

    async def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Sequence[tuple[str, str | bytes | None]] | None,
    ) -> None:
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
        processed = self.app.barrier.processed
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
        if one comes back it is restored from the changelog, not from a stale local copy."""
        mine = {tp.partition for tp in assigned if tp.topic == self.settings.input_topic}
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


# --------------------------------------------------------------------- settings and cluster


def broker_credentials(kafka: Mapping[str, Any]) -> CredentialsT | None:
    """librdkafka security settings as faust credentials (aiokafka underneath)."""
    protocol = str(kafka.get("security.protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return None
    context: ssl.SSLContext | None = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=kafka.get("ssl.ca.location") or None)
        cert = kafka.get("ssl.certificate.location")
        if cert:
            context.load_cert_chain(
                cert, kafka.get("ssl.key.location") or None, kafka.get("ssl.key.password")
            )
        if str(kafka.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
            context.check_hostname = False
    if protocol == "SSL":
        assert context is not None
        return cast(CredentialsT, faust.SSLCredentials(context))
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = str(kafka.get("sasl.mechanism", "PLAIN")).upper()
        if mechanism not in _SASL_MECHANISMS:
            raise FaustRuntimeError(f"sasl.mechanism {mechanism!r} is not supported here")
        return cast(
            CredentialsT,
            SASLCredentials(
                username=kafka.get("sasl.username"),
                password=kafka.get("sasl.password"),
                ssl_context=context,
                mechanism=mechanism,
            ),
        )
    raise FaustRuntimeError(f"security.protocol {protocol!r} is not supported")


def run_faust_worker(settings: WorkerSettings, metrics: WorkerMetrics) -> int:
    """Run the faust worker until SIGTERM: 0 after a graceful stop, 1 after a crash, 2 when the
    cluster or the settings do not allow it to start."""
    if settings.store != "memory":
        log.error("the faust runtime keeps its table in memory (store=%s)", settings.store)
        return ExitCode.UNUSABLE
    try:
        partitions, replication = inspect_topics(AdminClient(dict(settings.kafka)), settings)
        worker = FaustWorker(
            settings,
            partitions=partitions,
            replication=replication,
            credentials=broker_credentials(settings.kafka),
            metrics=metrics,
        )
    except (FaustRuntimeError, TopologyError, KafkaClientError, ssl.SSLError, OSError) as exc:
        log.error("cannot start the faust worker: %s", exc)
        return ExitCode.UNUSABLE
    return worker.run()
