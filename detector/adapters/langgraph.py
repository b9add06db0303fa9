"""LangGraph: every run on a thread as an owner, through a checkpointer that wraps the user's.

    from detector.adapters.langgraph import PostgresThreads, SplitbrainCheckpointer
    saver = SplitbrainCheckpointer(PostgresSaver(conn), threads=PostgresThreads(LEASE_DSN))
    graph = builder.compile(checkpointer=saver)  # graph.invoke(..., config) as before

LangGraph has no owner epoch and fences nothing: two runs on one thread both write, and the
chain of checkpoints forks (a parent gets a second child; the thread's state then follows one
branch and the other run's update is gone: langchain-ai/langgraph#8796). This wrapper delegates
every call to the saver it wraps and, after each `put` the saver accepted, records the
checkpoint in a thread ledger:

- Key: the thread id, `thread/namespace` for a subgraph's checkpoints.
- Epoch: a run's first put (its `input` checkpoint, or a put whose parent is no run's head in
  this process) takes the thread's next epoch from the ledger. `PostgresThreads` allocates it in
  the lease store's database, as a claim takes a fencing token: one winner per value, growing per
  thread. LangGraph never checks it, so it is `approximate` (B) and the acquisition is the
  worker's word. `LocalThreads` mints it from the clock in this process: `minted` (C).
- Seq: `PostgresThreads` gives every acquisition and checkpoint the thread's next seq under the
  same row lock, right after the saver's put returned: the database's order of the records.
  `LocalThreads` gives none (arrival order).
- Events: `lease_acquired` at a run's first put, `progress` per checkpoint, `lease_released`
  at the end of an explicit `with saver.run(config):` block (an implicit run's end is not
  visible to a checkpointer).
- A fork: a put whose parent already has another child. The ledger keeps each parent's first
  child under a primary key (`PostgresThreads`: exactly one writer is first, across processes;
  `LocalThreads`: within this process only). The second writer reports both children as
  `effect_committed` of the effect key `checkpoint-child/<parent id>`, each under its own
  writer's epoch: one visible result (the thread's next state) made twice under two epochs is
  a failover `duplicate_effect` (critical); two children under one epoch, a retry (warning).
  In PostgreSQL the database confirms both, so they are the destination's word.

Whatever fails here is logged and counted, never raised into the graph's put.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Generic, ParamSpec, Protocol, TypeVar

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from prometheus_client import Counter
from psycopg.rows import DictRow

from detector.contracts.events import Kind, Source
from detector.leases.db import Database
from detector.leases.schema import LANGGRAPH, migrate

from ._context import Authority, Ownership, Word, current, owning, words
from ._handoff import Handoff
from ._sink import DEFAULT_LINGER_S, AdapterSink

__all__ = [
    "ADAPTER",
    "LocalThreads",
    "PostgresThreads",
    "SplitbrainCheckpointer",
    "ThreadLedger",
    "fork_effect_key",
    "workflow_key",
]

log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")

ADAPTER: Final = "langgraph"
ROOT: Final = ""  # the parent of a thread's first checkpoint
_HEADS: Final = 10_000  # run heads remembered in this process (an evicted one: a new epoch)
_LOCAL_CHILDREN: Final = 100_000  # first children `LocalThreads` remembers

_BEHIND: Final = 10_000  # records waiting for a blocking ledger; beyond, counted and dropped
_BATCH: Final = 500  # records in one round trip to a blocking ledger
_IDLE_WAIT_S: Final = 1.0

UNRECORDED: Final = Counter(
    "splitbrain_adapter_puts_unrecorded",
    "Checkpoint puts an adapter did not record (the put itself succeeded), by reason: the "
    "ledger failed, or too many puts were waiting for it",
    ["adapter", "reason"],
)


def workflow_key(thread_id: str, checkpoint_ns: str = "") -> str:
    """The thread id; a subgraph's checkpoints (their own chain) are `thread/namespace`."""
    return f"{thread_id}/{checkpoint_ns}" if checkpoint_ns else thread_id


def fork_effect_key(parent_id: str | None) -> str:
    """The visible result two writers of one thread both make: the parent's next checkpoint."""
    return f"checkpoint-child/{parent_id or 'root'}"


# ---- the thread ledger -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Child:
    """A checkpoint as the ledger recorded it: who wrote it, under which epoch, at which seq."""

    checkpoint_id: str
    epoch: int
    worker_id: str
    seq: int | None


@dataclass(frozen=True, slots=True)
class Recorded:
    """One put, recorded: its seq, and the parent's first child when that is another one."""

    seq: int | None
    first: Child | None


@dataclass(slots=True)  # not frozen: built per put, and frozen costs µs
class Step:
    """One step of a batch the ledger records in order: begin a run (the thread's next epoch, and
    a seq for its acquisition), record the checkpoint `child_id` (under `epoch`, or the epoch
    begun by step `run` of the same batch), or, with neither, take the thread's next seq."""

    thread_id: str
    checkpoint_ns: str
    begin: bool = False
    parent_id: str | None = None
    child_id: str | None = None
    worker_id: str = ""
    epoch: int | None = None
    run: int | None = None


@dataclass(slots=True)  # not frozen: built per put, and frozen costs µs
class Done:
    """What a step got: the epoch and seq it began; its checkpoint's (or tick's) seq, and the
    parent's first child when that is another one."""

    epoch: int | None = None
    begun_seq: int | None = None
    seq: int | None = None
    first: Child | None = None


class ThreadLedger(Protocol):
    """Where runs take epochs and checkpoints are recorded."""

    @property
    def authority(self) -> Authority: ...

    @property
    def epoch_from(self) -> str: ...

    @property
    def destination(self) -> bool:
        """The ledger is the checkpoint store's own word on which child came first."""
        ...

    @property
    def blocking(self) -> bool:
        """Calls wait on a server: an async put makes them off the event loop."""
        ...

    def begin(self, thread_id: str, checkpoint_ns: str) -> tuple[int, int | None]:
        """A new run's epoch on the thread, and the acquisition's seq."""
        ...

    def record(
        self, thread_id: str, checkpoint_ns: str, parent_id: str | None, child: Child
    ) -> Recorded: ...

    def tick(self, thread_id: str, checkpoint_ns: str) -> int | None:
        """The thread's next seq (for a release)."""
        ...

    def steps(self, steps: Sequence[Step]) -> list[Done]:
        """Each step in order, all or none."""
        ...


def each_step(ledger: ThreadLedger, steps: Sequence[Step]) -> list[Done]:
    """A batch as one call per step, for a ledger without a batched call of its own."""
    done: list[Done] = []
    for step in steps:
        epoch: int | None = None
        begun_seq: int | None = None
        if step.begin:
            epoch, begun_seq = ledger.begin(step.thread_id, step.checkpoint_ns)
        if step.child_id is None:
            seq = None if step.begin else ledger.tick(step.thread_id, step.checkpoint_ns)
            done.append(Done(epoch, begun_seq, seq))
            continue
        mine = step.epoch if step.epoch is not None else epoch
        if mine is None:  # its run began at an earlier step of this batch
            assert step.run is not None
            mine = done[step.run].epoch
        assert mine is not None
        child = Child(step.child_id, mine, step.worker_id, None)
        recorded = ledger.record(step.thread_id, step.checkpoint_ns, step.parent_id, child)
        done.append(Done(epoch, begun_seq, recorded.seq, recorded.first))
    return done


class LocalThreads:
    """A ledger in this process: epochs from the clock (µs, growing per thread), no seq, and
    forks seen only between runs of this process (the last 100,000 parents)."""

    authority = Authority.MINTED
    epoch_from = "langgraph.local_clock_us"
    destination = False
    blocking = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epochs: dict[tuple[str, str], int] = {}
        self._children: OrderedDict[tuple[str, str, str], Child] = OrderedDict()

    def begin(self, thread_id: str, checkpoint_ns: str) -> tuple[int, int | None]:
        with self._lock:
            key = (thread_id, checkpoint_ns)
            epoch = max(self._epochs.get(key, 0) + 1, time.time_ns() // 1000)
            self._epochs[key] = epoch
            return epoch, None

    def record(
        self, thread_id: str, checkpoint_ns: str, parent_id: str | None, child: Child
    ) -> Recorded:
        key = (thread_id, checkpoint_ns, parent_id or ROOT)
        with self._lock:
            first = self._children.setdefault(key, child)
            if len(self._children) > _LOCAL_CHILDREN:
                self._children.popitem(last=False)
        return Recorded(None, None if first.checkpoint_id == child.checkpoint_id else first)

    def tick(self, thread_id: str, checkpoint_ns: str) -> int | None:
        return None

    def steps(self, steps: Sequence[Step]) -> list[Done]:
        return each_step(self, steps)


# Migration 6 of the lease store: the steps of a batch in order, in one transaction, each thread
# locked from its first step to the end (the fork check as atomic as one statement's).
_STEPS: Final = """
SELECT step, begun_epoch, begun_seq, seq, first_child, first_epoch, first_worker, first_seq
  FROM splitbrain_langgraph_steps(%s::jsonb)
 ORDER BY step
"""


class PostgresThreads:
    """A ledger in a database every instance reaches (`setup()`, or `splitbrain leases migrate
    --langgraph`; the checkpoints' own will do): each
    call, a whole batch of steps included, is one statement on a connection of its own (a forked
    child makes its own), with the lease store's timeouts."""

    authority = Authority.APPROXIMATE
    epoch_from = "splitbrain.langgraph_threads"
    destination = True
    blocking = True

    def __init__(self, dsn: str) -> None:
        self._db = Database(dsn)
        self._lock = threading.Lock()

    def setup(self) -> None:
        """Create the ledger's own tables and function (the lease store's migrations 5 and 6),
        and nothing of the job queue's."""
        with self._connection() as conn:
            migrate(conn, only=LANGGRAPH)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def begin(self, thread_id: str, checkpoint_ns: str) -> tuple[int, int | None]:
        (done,) = self.steps([Step(thread_id, checkpoint_ns, begin=True)])
        assert done.epoch is not None
        return done.epoch, done.begun_seq

    def record(
        self, thread_id: str, checkpoint_ns: str, parent_id: str | None, child: Child
    ) -> Recorded:
        step = Step(
            thread_id, checkpoint_ns, False, parent_id, child.checkpoint_id, child.worker_id
        )
        (done,) = self.steps([dataclasses.replace(step, epoch=child.epoch)])
        return Recorded(done.seq, done.first)

    def tick(self, thread_id: str, checkpoint_ns: str) -> int | None:
        (done,) = self.steps([Step(thread_id, checkpoint_ns)])
        return done.seq

    def steps(self, steps: Sequence[Step]) -> list[Done]:
        """One statement (one round trip) for the whole batch."""
        batch = json.dumps(
            [
                (
                    s.thread_id,
                    s.checkpoint_ns,
                    s.begin,
                    s.parent_id or ROOT,
                    s.child_id,
                    s.worker_id,
                    s.epoch,
                    s.run,
                )
                for s in steps
            ]
        )
        with self._connection() as conn:
            rows = conn.execute(_STEPS, (batch,), prepare=True).fetchall()
        return [_done(step, row) for step, row in zip(steps, rows, strict=True)]

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        """The connection, one caller at a time; a broken one is replaced on the next call, and
        a forked child makes its own."""
        with self._lock:
            yield self._db.connection()


def _done(step: Step, row: DictRow) -> Done:
    first = None
    if row["first_child"] is not None and row["first_child"] != step.child_id:
        first = Child(row["first_child"], row["first_epoch"], row["first_worker"], row["first_seq"])
    return Done(row["begun_epoch"], row["begun_seq"], row["seq"], first)


class _Behind(Generic[_T]):
    """Hands queued items to `drain`, in order and as many at a time as are waiting (up to
    `_BATCH`: one round trip for them all), on a daemon thread of its own, so that a ledger
    waiting on its server never makes the graph's put wait. Bounded: an item that does not fit
    is dropped, and `on_drop` counts it. The putting thread wakes the runner only when it sleeps
    (a wake-up costs the put more than queueing the item); woken, the runner lingers as the
    Kafka sink's sender does, unless a flush waits, so that a batch gathers the puts of a few
    invocations (a round trip costs this process more CPU than the steps in it)."""

    def __init__(
        self, name: str, drain: Callable[[list[_T]], None], on_drop: Callable[[], None]
    ) -> None:
        self._name = name
        self._drain = drain
        self._on_drop = on_drop
        self._queue: deque[_T] = deque()
        self._handoff = Handoff()
        self._hurry = threading.Event()  # a flush waits: no lingering
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def submit(self, item: _T) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's calls are the parent's
            self._pid = os.getpid()
            self._queue.clear()
            self._thread = None
            self._handoff = Handoff()
        if len(self._queue) >= _BEHIND:
            self._on_drop()
            return
        self._queue.append(item)
        handoff = self._handoff
        if handoff.idle.is_set():  # after the append: the runner re-checks the queue once idle
            handoff.idle.clear()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
        if handoff.sleeping:
            handoff.wake.set()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued item was drained; True when that happened in time."""
        if self._pid != os.getpid():  # a forked child: nothing of its own queued yet
            return True
        self._hurry.set()
        self._handoff.wake.set()
        return self._handoff.idle.wait(timeout)

    def _run(self) -> None:
        while True:
            queue = self._queue
            while queue:
                self._drain([queue.popleft() for _ in range(min(len(queue), _BATCH))])
            if not self._handoff.rest(queue, _IDLE_WAIT_S):
                continue
            if self._queue:
                self._hurry.wait(DEFAULT_LINGER_S)
            self._hurry.clear()


@dataclass(frozen=True, slots=True)
class _Put:
    """What recording a put needs, taken on the putting thread, whose context names its run."""

    thread_id: str
    ns: str
    parent_id: str | None
    child_id: str
    step: Any
    source: str | None
    explicit: Ownership | None  # the `run()` around the put, for this key
    invocation: dict[str, _Run] | None  # the runs of the graph invocation around it

    @property
    def key(self) -> str:
        return workflow_key(self.thread_id, self.ns)


@dataclass(frozen=True, slots=True)
class _Release:
    """The end of an explicit run: a `lease_released` at the thread's next seq."""

    owner: Ownership
    thread_id: str
    ns: str


class _Run:
    """A run as the recording side knows it: its owner once the ledger gave its epoch; until
    then, the step that begins it in `batch` (the batch's runs). Without an owner, it is usable
    only in that batch: a run whose beginning failed, or one in flight in a parent process at
    its fork, is no run, and the next put that would be its begins a new one."""

    __slots__ = ("batch", "owner", "step")

    def __init__(
        self, owner: Ownership | None = None, step: int = 0, batch: list[_Run] | None = None
    ) -> None:
        self.owner = owner
        self.step = step
        self.batch = batch

    def usable(self, batch: list[_Run]) -> bool:
        return self.owner is not None or self.batch is batch


# ---- the checkpointer ------------------------------------------------------------------------


def node_words() -> dict[str, Word]:
    """The graph node the calling code runs in, in LangGraph's words (its run's metadata:
    `langgraph_node`, `langgraph_step`); empty outside a node."""
    try:
        from langgraph.config import get_config  # noqa: PLC0415  (cheap: already imported)

        meta = get_config().get("metadata") or {}
    except Exception:  # outside a runnable: no node to name
        return {}
    node, step = meta.get("langgraph_node"), meta.get("langgraph_step")
    return words(
        node=node if isinstance(node, str) else None,
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
    )


@dataclass(frozen=True, slots=True)
class _GraphOwnership(Ownership):
    """An owner of a thread whose user effect calls also name the node they run in."""

    def checked(self, kind: Kind, **fields: Any) -> None:
        node = node_words()
        if node:
            fields["detail"] = {**node, **(fields.get("detail") or {})}
        Ownership.checked(self, kind, **fields)  # (a slots dataclass: no bare super())


def _default_worker_id() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def _on_postgres(saver: BaseCheckpointSaver[Any]) -> bool:
    """LangGraph's PostgreSQL savers (sync, async, shallow), without importing them."""
    return type(saver).__module__.startswith("langgraph.checkpoint.postgres")


def _event_id(key: str, parent_id: str | None, child_id: str) -> str:
    """The same fork child reported twice (by a third writer) is one event."""
    text = f"{key}\0{parent_id or ROOT}\0{child_id}"
    return "lg-" + hashlib.sha256(text.encode()).hexdigest()[:32]


class SplitbrainCheckpointer(BaseCheckpointSaver[Any]):
    """Wraps `saver`: every call is the saver's; each accepted `put` is also recorded."""

    def __init__(
        self,
        saver: BaseCheckpointSaver[Any],
        *,
        threads: ThreadLedger | None = None,
        sink: AdapterSink | None = None,
        worker_id: str | None = None,
    ) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver
        self.threads: ThreadLedger = LocalThreads() if threads is None else threads
        if self.threads.authority is Authority.MINTED and _on_postgres(saver):
            log.warning(
                "langgraph adapter: %s with the in-process ledger sees no fork between "
                "processes; pass threads=PostgresThreads(dsn)",
                type(saver).__name__,
            )
        self.sink = AdapterSink(ADAPTER) if sink is None else sink
        self.worker_id = worker_id or _default_worker_id()
        self._lock = threading.Lock()
        # (workflow key, checkpoint id) of each run's latest checkpoint -> that run
        self._heads: OrderedDict[tuple[str, str], _Run] = OrderedDict()
        self._failed = UNRECORDED.labels(ADAPTER, "ledger")
        self._draining = threading.Lock()  # an in-process ledger: one put at a time
        self._behind: _Behind[_Put | _Release] = _Behind(
            f"splitbrain-{ADAPTER}-ledger",
            self._drain,
            UNRECORDED.labels(ADAPTER, "queue_full").inc,
        )
        # At exit, the ledger's records become events before the sink sends what it holds.
        self.sink.flush_first(self._behind.flush)
        # The runs of the graph invocation whose context this is, by workflow key.
        self._invocation: ContextVar[dict[str, _Run] | None] = ContextVar(
            f"splitbrain_langgraph_{id(self)}", default=None
        )

    # ---- an explicit run: its epoch for the user's effect calls, and its release -----------------

    @contextlib.contextmanager
    def run(self, config: RunnableConfig) -> Iterator[Ownership | None]:
        """Run a block (a `graph.invoke(..., config)`) as one owner of the thread: effect calls
        inside the graph's nodes carry its key and epoch, and its end is a `lease_released`.
        None (and the block runs unwatched) when the ledger cannot be reached."""
        conf = config.get("configurable", {})
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        owner = self._guard(self._acquire, thread_id, ns)
        if owner is None:
            yield None
            return
        with owning(owner):
            try:
                yield owner
            finally:
                self._later(_Release(owner, thread_id, ns))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every put so far is recorded and its events handed to Kafka (tests,
        shutdown). True when that happened in time."""
        deadline = time.monotonic() + timeout
        recorded = self._behind.flush(timeout)
        return self.sink.flush(max(deadline - time.monotonic(), 0.0)) and recorded

    # ---- puts ----------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved = self.saver.put(config, checkpoint, metadata, new_versions)
        self._guard(self._watch, config, checkpoint, metadata)
        return saved

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved = await self.saver.aput(config, checkpoint, metadata, new_versions)
        self._guard(self._watch, config, checkpoint, metadata)
        return saved

    def _guard(self, method: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T | None:
        """The graph never sees a failure of ours: it is logged and counted, never raised."""
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            self._failed.inc()
            log.warning("langgraph adapter: %s failed (%s)", method.__name__, type(exc).__name__)
            return None

    def _later(self, item: _Put | _Release) -> None:
        """Recorded now with an in-process ledger; behind the put, in batches, with a blocking
        one."""
        if self.threads.blocking:
            self._behind.submit(item)
        else:
            with self._draining:
                self._drain([item])

    def _watch(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> None:
        conf = config.get("configurable", {})
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        explicit = current()
        if not (
            explicit is not None
            and explicit.sink is self.sink
            and explicit.workflow_key == workflow_key(thread_id, ns)
        ):
            explicit = None
        put = _Put(
            thread_id,
            ns,
            conf.get("checkpoint_id"),
            checkpoint["id"],
            metadata.get("step"),
            metadata.get("source"),
            explicit,
            self._invocation.get(),
        )
        self._later(put)

    def _drain(self, items: list[_Put | _Release]) -> None:
        """Record a batch in one ledger call, then send its events in order. A failed call
        loses the batch (each item counted), never the graph's put. One batch at a time."""
        runs: list[_Run] = []
        try:
            steps = [self._step(item, runs) for item in items]
            done = self.threads.steps(steps)
        except Exception as exc:
            self._failed.inc(len(items))
            log.warning("langgraph adapter: recording failed (%s)", type(exc).__name__)
            return
        for item, run, step, got in zip(items, runs, steps, done, strict=True):
            self._guard(self._sent, item, run, step, got)

    def _step(self, item: _Put | _Release, runs: list[_Run]) -> Step:
        """The ledger step of one item, the next of the batch whose runs are `runs` (its run
        appended)."""
        if isinstance(item, _Release):
            runs.append(_Run(item.owner))
            return Step(item.thread_id, item.ns)
        run, begins = self._run(item, runs)
        runs.append(run)
        owner = run.owner
        return Step(
            item.thread_id,
            item.ns,
            begins,
            item.parent_id,
            item.child_id,
            self.worker_id if owner is None else owner.worker_id,
            None if owner is None else owner.owner_epoch,
            None if owner is not None else run.step,
        )

    def _sent(self, item: _Put | _Release, run: _Run, step: Step, got: Done) -> None:
        """The events of one recorded item."""
        if step.begin:
            assert got.epoch is not None and isinstance(item, _Put)
            run.owner = self._owner(item.thread_id, item.ns, got.epoch)
            run.owner.acquired(
                seq=got.begun_seq, detail={"checkpoint_source": item.source or "run"}
            )
        owner = run.owner
        assert owner is not None  # its run began at this step or before
        if isinstance(item, _Release):
            owner.emit(Kind.LEASE_RELEASED, seq=got.seq)
            return
        detail = {"step": item.step, "checkpoint_id": item.child_id}
        owner.emit(Kind.PROGRESS, seq=got.seq, detail=detail)
        if got.first is not None:
            self._fork(owner, item, got)

    def _run(self, put: _Put, batch: list[_Run]) -> tuple[_Run, bool]:
        """The run this put belongs to, and whether it begins here (at the batch's next step): the
        explicit run around it; else the invocation whose `get_tuple` began it (a graph reads
        its thread before it writes, and its puts run in a copy of that context); else the run
        whose head is its parent (an `input` checkpoint always starts one); else a new run."""
        if put.explicit is not None:
            return _Run(put.explicit), False
        if put.invocation is not None:
            with self._lock:
                run = put.invocation.get(put.key)
                if run is not None and run.usable(batch):
                    return run, False
                run = put.invocation[put.key] = _Run(None, len(batch), batch)
            return run, True
        key, heads = put.key, self._heads
        with self._lock:
            found = None
            if put.source != "input" and put.parent_id is not None:
                found = heads.pop((key, put.parent_id), None)
            begins = found is None or not found.usable(batch)
            if found is None or begins:
                found = _Run(None, len(batch), batch)
            heads[(key, put.child_id)] = found
            if len(heads) > _HEADS:
                heads.popitem(last=False)
        return found, begins

    def _acquire(self, thread_id: str, ns: str) -> Ownership:
        epoch, seq = self.threads.begin(thread_id, ns)
        owner = self._owner(thread_id, ns, epoch)
        owner.acquired(seq=seq, detail={"checkpoint_source": "run"})
        return owner

    def _owner(self, thread_id: str, ns: str, epoch: int) -> Ownership:
        return _GraphOwnership(
            self.sink,
            workflow_key(thread_id, ns),
            epoch,
            self.worker_id,
            self.threads.authority,
            self.threads.epoch_from,
            words=words(thread_id=thread_id, checkpoint_ns=ns or None),
        )

    def _fork(self, owner: Ownership, put: _Put, recorded: Done) -> None:
        """Both children of the parent, each as its writer's commit of the parent's next
        checkpoint (the second writer knows both; the first never learns it was forked)."""
        first = recorded.first
        assert first is not None
        source = Source.DESTINATION if self.threads.destination else Source.WORKER
        effect = fork_effect_key(put.parent_id)
        detail = {"parent_id": put.parent_id or ROOT, "step": put.step}
        earlier = dataclasses.replace(owner, owner_epoch=first.epoch, worker_id=first.worker_id)
        for writer, child, seq in (
            (earlier, first.checkpoint_id, first.seq),
            (owner, put.child_id, recorded.seq),
        ):
            writer.emit(
                Kind.EFFECT_COMMITTED,
                event_id=_event_id(put.key, put.parent_id, child),
                effect_key=effect,
                seq=seq,
                source=source,
                destination=ADAPTER,
                detail={**detail, "checkpoint_id": child},
            )
        log.warning(
            "langgraph thread forked: parent=%s children=%s,%s epochs=%d,%d",
            put.parent_id or ROOT,
            first.checkpoint_id,
            put.child_id,
            first.epoch,
            owner.owner_epoch,
        )

    # ---- everything else is the saver's ---------------------------------------------------------

    @property
    def config_specs(self) -> list[Any]:
        return self.saver.config_specs

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Also where a graph invocation begins: its later puts belong to a new run."""
        self._invocation.set({})
        return self.saver.get_tuple(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return self.saver.list(config, filter=filter, before=before, limit=limit)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.saver.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.saver.delete_for_runs(run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.saver.copy_thread(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.saver.prune(thread_ids, strategy=strategy)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._invocation.set({})
        return await self.saver.aget_tuple(config)

    def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        return self.saver.alist(config, filter=filter, before=before, limit=limit)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self.saver.aput_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.saver.adelete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.saver.acopy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.saver.aprune(thread_ids, strategy=strategy)

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]) -> Any:
        return self.saver.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Any:
        return await self.saver.aget_delta_channel_history(config=config, channels=channels)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)

    def with_allowlist(self, extra_allowlist: Any) -> SplitbrainCheckpointer:
        """A clone around the saver's clone: the same ledger, sink and runs."""
        inner = self.saver.with_allowlist(extra_allowlist)
        if inner is self.saver:
            return self
        clone = copy.copy(self)
        clone.saver = inner
        clone.serde = inner.serde
        return clone
