"""What each adapter costs the host it watches (issue 21: at most 5% on a no-op task or
activity, at most 50 µs per event on the emitting thread).

Each adapter adds one function to `BENCHES`: it runs that system's real server, measures, and
returns `Row`s; `main` prints them with the machine's load. The sink publishes to a discarding
publisher, so the figures are the adapter's and the sink's (its sender thread included, since it
competes for the GIL), not Kafka's. Asserts nothing.
Run: `python bench/bench_adapters.py [--only NAME ...] [--activities N] [--rounds N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import platform
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from detector.adapters import AdapterSink
from detector.contracts.events import OwnershipEvent
from detector.devstack.topics import create_topics


@dataclass(frozen=True)
class Row:
    adapter: str
    measure: str
    value: float
    unit: str
    target: float | None = None  # at most this much, in `unit`
    note: str = ""

    def line(self) -> str:
        verdict = ""
        if self.target is not None:
            verdict = "  ok" if self.value <= self.target else "  OVER"
            verdict += f" (target <= {self.target:g} {self.unit})"
        note = f"  [{self.note}]" if self.note else ""
        return f"{self.adapter:<10} {self.measure:<48} {self.value:9.2f} {self.unit}{verdict}{note}"


class _Discard:
    """The emitter's place: takes each event and forgets it."""

    def publish(self, event: OwnershipEvent, value: bytes) -> None:
        pass

    def publish_json(self, workflow_key: str, value: bytes) -> None:
        pass

    def flush(self, timeout: float = 0) -> None:
        pass

    def close(self) -> None:
        pass


def discarding_sink(adapter: str) -> AdapterSink:
    return AdapterSink(
        adapter, publisher=_Discard, capacity=10_000_000, registry=CollectorRegistry()
    )


# ---- Temporal ----------------------------------------------------------------------------------


def bench_temporal(args: argparse.Namespace) -> list[Row]:
    """On the real test server, in rounds alternating a worker without and with the interceptor
    (the best round of each): no-op activities, one after another in one workflow; no-op
    workflows, one after another (each a run the interceptor acquires and releases). Then the
    interceptor's own work per attempt on the worker's event loop (reading the attempt, its two
    events, the timeout's timer), and per event sent from workflow code."""
    from temporalio.client import Client  # noqa: PLC0415

    from detector.devstack.temporal import LocalTemporal, ProgressBatch  # noqa: PLC0415

    with LocalTemporal() as server:

        async def measure() -> tuple[dict[str, tuple[list[Cost], list[Cost]]], float]:
            client = await Client.connect(server.target)
            rounds: dict[str, tuple[list[Cost], list[Cost]]] = {
                "activity": ([], []),
                "workflow": ([], []),
            }
            for _ in range(args.rounds):
                for unit, (plain, intercepted) in rounds.items():
                    plain.append(await _temporal_round(client, unit, args.activities, None))
                    sink = discarding_sink("temporal")
                    intercepted.append(await _temporal_round(client, unit, args.activities, sink))
                    sink.close()
            # Batches small enough for the SDK's 2 s deadlock detection on a loaded machine.
            sink = discarding_sink("temporal")
            async with _temporal_worker(client, sink) as queue:
                per_event = [
                    await client.execute_workflow(
                        ProgressBatch.run,
                        _WORKFLOW_BATCH,
                        id=f"bench-{uuid.uuid4().hex}",
                        task_queue=queue,
                    )
                    for _ in range(max(args.events // _WORKFLOW_BATCH, 1))
                ]
            sink.close()
            return rounds, min(per_event)

        rounds, workflow_event = asyncio.run(measure())
    cpu, wall, beat = _temporal_per_event(args.events)
    note = f"best of {args.rounds} rounds of {args.activities}"
    per_attempt = "an attempt's acquired + released, its timer armed and cancelled"
    rows = []
    for unit, (plain, intercepted) in rounds.items():
        base_cpu, with_cpu = _best(plain, 0), _best(intercepted, 0)
        base_wall, with_wall = _best(plain, 1), _best(intercepted, 1)
        rows += [
            Row("temporal", f"no-op {unit}, worker CPU, no interceptor", base_cpu, "us", note=note),
            Row("temporal", f"no-op {unit}, worker CPU, SplitbrainInterceptor", with_cpu, "us"),
            Row("temporal", f"overhead per {unit}, worker CPU", _pct(with_cpu, base_cpu), "%", 5.0),
            Row("temporal", f"no-op {unit}, wall, no interceptor", base_wall, "us"),
            Row("temporal", f"no-op {unit}, wall, SplitbrainInterceptor", with_wall, "us"),
            Row(
                "temporal",
                f"overhead per {unit}, wall (the load adds noise)",
                _pct(with_wall, base_wall),
                "%",
            ),
        ]
    return [
        *rows,
        Row("temporal", "per event, emitting thread's CPU", cpu, "us", 50.0, per_attempt),
        Row("temporal", "per event, wall time (the load adds to it)", wall, "us"),
        Row("temporal", "heartbeat() call, CPU (events at the SDK's throttle)", beat, "us"),
        Row(
            "temporal",
            "per event from workflow code, its thread's CPU",
            workflow_event,
            "us",
            50.0,
            f"best batch of {_WORKFLOW_BATCH} progress() in one task: replay and read-only checks",
        ),
    ]


Cost = tuple[float, float]  # µs per activity: the worker process's CPU (all its threads), wall
_WORKFLOW_BATCH = 1000  # events per workflow task when measuring events from workflow code


def _best(costs: list[Cost], which: int) -> float:
    """The best round: what the work costs when the machine's other load leaves it alone."""
    return min(c[which] for c in costs)


def _pct(value: float, base: float) -> float:
    return (value - base) / base * 100


@contextlib.asynccontextmanager
async def _temporal_worker(client: Any, sink: AdapterSink | None) -> AsyncIterator[str]:
    """A worker of the benchmark's workflows and activity, with the interceptor when `sink`;
    yields its task queue."""
    from temporalio.worker import Worker  # noqa: PLC0415

    from detector.adapters.temporal import SplitbrainInterceptor  # noqa: PLC0415
    from detector.devstack.temporal import NoopBatch, NoopWorkflow, ProgressBatch, noop  # noqa: PLC0415

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    interceptors = [] if sink is None else [SplitbrainInterceptor(sink, worker_id="bench")]
    async with Worker(
        client,
        task_queue=queue,
        workflows=[NoopBatch, NoopWorkflow, ProgressBatch],
        activities=[noop],
        interceptors=interceptors,
    ):
        yield queue


async def _temporal_round(client: Any, unit: str, count: int, sink: AdapterSink | None) -> Cost:
    """Per no-op `unit`: `count` activities run one after another by one workflow, or `count`
    workflows run one after another (the server is another process: its CPU is not counted;
    the client's is, the same in both)."""
    from detector.devstack.temporal import NoopBatch, NoopWorkflow  # noqa: PLC0415

    async with _temporal_worker(client, sink) as queue:
        cpu, wall = time.process_time(), time.perf_counter()
        if unit == "activity":
            await client.execute_workflow(
                NoopBatch.run, count, id=f"bench-{uuid.uuid4().hex}", task_queue=queue
            )
        else:
            for _ in range(count):
                await client.execute_workflow(
                    NoopWorkflow.run, id=f"bench-{uuid.uuid4().hex}", task_queue=queue
                )
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return cpu / count * 1e6, wall / count * 1e6


def _temporal_per_event(n: int) -> tuple[float, float, float]:
    """Per event of `_begin` + `end` (two events): µs of the emitting thread's CPU and of wall
    time (which a loaded machine inflates); µs of CPU per `heartbeat()` call. In an activity's
    context, on an event loop, as the worker runs them."""
    from temporalio.testing import ActivityEnvironment  # noqa: PLC0415

    from detector.adapters.temporal import SplitbrainInterceptor  # noqa: PLC0415

    sink = discarding_sink("temporal")
    interceptor = SplitbrainInterceptor(sink, worker_id="bench")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=30))

    async def attempts() -> tuple[float, float, float]:
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(n):
            attempt = interceptor._begin()
            assert attempt is not None
            attempt.end("completed")
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        attempt = interceptor._begin()
        assert attempt is not None
        beats = time.thread_time()
        for _ in range(n):
            attempt.heartbeat()
        beats = time.thread_time() - beats
        attempt.end("completed")
        return cpu / (2 * n) * 1e6, wall / (2 * n) * 1e6, beats / n * 1e6

    try:
        result: tuple[float, float, float] = asyncio.run(env.run(attempts))
        return result
    finally:
        sink.close()


# ---- Celery ------------------------------------------------------------------------------------


def bench_celery(args: argparse.Namespace) -> list[Row]:
    """No-op `acks_late` tasks through a real worker on a real redis-server (what a user feels:
    the broker's fetch and ack, the trace, the signals), in rounds alternating a worker without
    and with the adapter (epochs minted by INCR on that Redis: its round trip is in the figure);
    then the handlers' own work per task on the task's thread, in `apply()` (eager)."""
    from detector.devstack.redis import LocalRedis  # noqa: PLC0415

    with LocalRedis() as server:
        plain: list[Cost] = []
        adapted: list[Cost] = []
        for _ in range(args.rounds):
            plain.append(_celery_round(server.url, args.tasks, adapted=False))
            adapted.append(_celery_round(server.url, args.tasks, adapted=True))
    base_cpu, with_cpu = _best(plain, 0), _best(adapted, 0)
    base_wall, with_wall = _best(plain, 1), _best(adapted, 1)
    eager_base, eager_with = _celery_eager(args.events)
    handlers = eager_with - eager_base
    send = _send_per_event(args.events)
    sender = _sender_per_event(args.events // 4)
    rounds = f"best of {args.rounds} rounds of {args.tasks} tasks; solo pool, acks_late"
    per_task = "prerun + postrun: epoch, acquired, context, released"
    paced = "two events per ~0.3 ms of the host's work: batches and wake-ups as a busy worker's"
    return [
        Row("celery", "no-op task, worker CPU, no adapter", base_cpu, "us", note=rounds),
        Row("celery", "no-op task, worker CPU, adapter", with_cpu, "us"),
        Row("celery", "overhead per task, worker CPU", _pct(with_cpu, base_cpu), "%", 5.0),
        Row("celery", "no-op task, wall, no adapter", base_wall, "us"),
        Row("celery", "no-op task, wall, adapter", with_wall, "us"),
        Row("celery", "overhead per task, wall", _pct(with_wall, base_wall), "%", 5.0),
        Row("celery", "apply() (eager), task thread's CPU, no adapter", eager_base, "us"),
        Row("celery", "apply() (eager), task thread's CPU, adapter", eager_with, "us"),
        Row("celery", "per event, emitting thread's CPU", handlers / 2, "us", 50.0, per_task),
        Row("celery", "per event, building it + AdapterSink.send", send, "us", 50.0),
        Row("celery", "per event, the sink's sender thread's CPU", sender, "us", note=paced),
    ]


def _send_per_event(n: int) -> float:
    """µs of the calling thread's CPU per `Ownership.emit` (the event's fields built, then
    `AdapterSink.send`), the best of three runs of `n`."""
    from detector.adapters import Authority, Ownership  # noqa: PLC0415
    from detector.contracts.events import Kind  # noqa: PLC0415

    sink = discarding_sink("bench")
    owner = Ownership(sink, "key", 1, "worker", Authority.MINTED, "redis.incr", {"a": "b"})
    best = float("inf")
    for _ in range(3):
        cpu = time.thread_time()
        for _ in range(n):
            owner.emit(Kind.PROGRESS)
        best = min(best, time.thread_time() - cpu)
        sink.flush(60)
    sink.close()
    return best / n * 1e6


def _sender_per_event(n: int) -> float:
    """µs of CPU per event spent outside the emitting thread (the sink's sender: encoding, the
    check, its wake-ups), the host sending two events between stretches of its own work."""
    from detector.adapters import Authority, Ownership  # noqa: PLC0415
    from detector.contracts.events import Kind  # noqa: PLC0415

    sink = discarding_sink("bench")
    owner = Ownership(sink, "key", 1, "worker", Authority.MINTED, "redis.incr", {"a": "b"})
    cpu, own = time.process_time(), time.thread_time()
    for _ in range(n // 2):
        sum(range(10_000))  # the host's own work
        owner.emit(Kind.PROGRESS)
        owner.emit(Kind.PROGRESS)
    sink.flush(60)
    other = (time.process_time() - cpu) - (time.thread_time() - own)
    sink.close()
    return other / n * 1e6


def _celery_app(url: str) -> Any:
    from celery import Celery  # noqa: PLC0415

    app = Celery(f"bench-{uuid.uuid4().hex[:8]}", broker=url)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=4,
        task_default_queue=f"bench-{uuid.uuid4().hex[:8]}",
        worker_hijack_root_logger=False,
    )
    app.task(name="noop")(_noop)
    return app


def _noop() -> None:
    pass


def _celery_round(url: str, tasks: int, *, adapted: bool) -> Cost:
    """Per task: the worker's CPU (this process: the worker runs in a thread of it, its pool in
    that thread) and wall time, from the first task's start to the last one's end; every task
    was queued before the worker started."""
    import threading  # noqa: PLC0415

    from celery import signals  # noqa: PLC0415
    from celery.contrib.testing.worker import start_worker  # noqa: PLC0415

    from detector.adapters.celery import install  # noqa: PLC0415

    app = _celery_app(url)
    for _ in range(tasks):
        app.send_task("noop")
    sink = discarding_sink("celery") if adapted else None
    adapter = install(app, sink=sink) if sink is not None else None
    marks: list[tuple[float, float]] = []
    done = threading.Event()

    def first(**_: Any) -> None:
        if not marks:
            marks.append((time.process_time(), time.perf_counter()))

    def last(**_: Any) -> None:
        if len(marks) == tasks:
            marks.append((time.process_time(), time.perf_counter()))
            done.set()
        else:
            marks.append(marks[0])

    signals.task_prerun.connect(first, weak=False)
    signals.task_postrun.connect(last, weak=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
            done.wait(600)
    finally:
        signals.task_prerun.disconnect(first)
        signals.task_postrun.disconnect(last)
        if adapter is not None:
            adapter.uninstall()
        if sink is not None:
            sink.close()
        app.close()
    (cpu0, wall0), (cpu1, wall1) = marks[0], marks[-1]
    return (cpu1 - cpu0) / tasks * 1e6, (wall1 - wall0) / tasks * 1e6


def _celery_eager(n: int) -> tuple[float, float]:
    """µs of the calling thread's CPU per `apply()` of a no-op task, without and with the
    adapter (its epoch from the redelivered flag: no round trip)."""
    from detector.adapters.celery import install  # noqa: PLC0415

    app = _celery_app("memory://")
    task = app.tasks["noop"]

    def per_apply() -> float:
        cpu = time.thread_time()
        for _ in range(n):
            task.apply()
        return (time.thread_time() - cpu) / n * 1e6

    base = min(per_apply() for _ in range(3))
    sink = discarding_sink("celery")
    adapter = install(app, sink=sink)
    try:
        adapted = min(per_apply() for _ in range(3))
    finally:
        adapter.uninstall()
        sink.close()
        app.close()
    return base, adapted


# ---- LangGraph ---------------------------------------------------------------------------------


def bench_langgraph(args: argparse.Namespace) -> list[Row]:
    """The small graph of the adapter's tests (three nodes, five checkpoints per invocation),
    each invocation on a new thread, in rounds alternating the bare saver and the wrapped one:
    LangGraph's InMemorySaver with the in-process ledger, and PostgresSaver with the
    PostgreSQL ledger (a real local server; its statements run behind the puts, on the
    wrapper's thread, and that thread's CPU is in the figure, the server's is not). Then the
    wrapper's own work per checkpoint put, on the putting thread."""
    from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415
    from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415

    from detector.adapters.langgraph import PostgresThreads  # noqa: PLC0415
    from detector.devstack.postgres import LocalPostgres  # noqa: PLC0415

    rows = _langgraph_rows("InMemorySaver", args, InMemorySaver, None)
    with LocalPostgres() as server:
        dsn = server.create_database("bench_langgraph")
        threads = PostgresThreads(dsn)
        threads.setup()
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
            rows += _langgraph_rows("PostgresSaver", args, lambda: saver, threads)
        threads.close()
    cpu, wall = _langgraph_per_event(args.events)
    note = "a put's progress (and its run's acquisition), in-process ledger"
    return [
        *rows,
        Row("langgraph", "per event, putting thread's CPU", cpu, "us", 50.0, note),
        Row("langgraph", "per event, wall time (the load adds to it)", wall, "us"),
    ]


def _langgraph_rows(
    name: str, args: argparse.Namespace, make: Callable[[], Any], threads: Any
) -> list[Row]:
    from detector.adapters.langgraph import SplitbrainCheckpointer  # noqa: PLC0415

    plain: list[Cost] = []
    wrapped: list[Cost] = []
    for _ in range(args.rounds):
        plain.append(_langgraph_round(make(), args.invocations))
        sink = discarding_sink("langgraph")
        saver = SplitbrainCheckpointer(make(), threads=threads, sink=sink, worker_id="bench")
        wrapped.append(_langgraph_round(saver, args.invocations))
        sink.close()
    base_cpu, with_cpu = _best(plain, 0), _best(wrapped, 0)
    base_wall, with_wall = _best(plain, 1), _best(wrapped, 1)
    rounds = f"best of {args.rounds} rounds of {args.invocations} invocations"
    return [
        Row("langgraph", f"invoke, CPU, bare {name}", base_cpu, "us", note=rounds),
        Row("langgraph", f"invoke, CPU, wrapped {name}", with_cpu, "us", note=rounds),
        Row("langgraph", f"overhead per invoke, CPU ({name})", _pct(with_cpu, base_cpu), "%", 5.0),
        Row("langgraph", f"invoke, wall, bare {name}", base_wall, "us"),
        Row("langgraph", f"invoke, wall, wrapped {name}", with_wall, "us"),
        Row("langgraph", f"overhead per invoke, wall ({name})", _pct(with_wall, base_wall), "%"),
    ]


def _langgraph_round(saver: Any, invocations: int) -> Cost:
    """Per invocation of the small graph: this process's CPU (LangGraph's threads and the
    wrapper's included) and wall time, until the wrapper has recorded every put."""
    from detector.adapters.langgraph import SplitbrainCheckpointer  # noqa: PLC0415
    from detector.demos.langgraph_graph import build, thread  # noqa: PLC0415

    graph = build(saver, interrupt=False)
    prefix = uuid.uuid4().hex[:8]
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(invocations):
        graph.invoke({"notes": []}, thread(f"bench-{prefix}-{i}"))
    if isinstance(saver, SplitbrainCheckpointer):
        assert saver.flush(60)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / invocations * 1e6, wall / invocations * 1e6


def _langgraph_per_event(n: int) -> tuple[float, float]:
    """µs of the putting thread's CPU, and of wall time, per event of the wrapper's work after
    a put (one `progress` per put; one acquisition for the run), with the in-process ledger."""
    from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415

    from detector.adapters.langgraph import SplitbrainCheckpointer  # noqa: PLC0415

    sink = discarding_sink("langgraph")
    saver = SplitbrainCheckpointer(InMemorySaver(), sink=sink, worker_id="bench")
    metadata: Any = {"source": "loop", "step": 1, "parents": {}}
    parent = None
    cpu, wall = time.thread_time(), time.perf_counter()
    for i in range(n):
        child = f"c{i}"
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_id": parent}}
        checkpoint: Any = {"id": child}
        saver._watch(config, checkpoint, metadata)
        parent = child
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    sink.close()
    return cpu / (n + 1) * 1e6, wall / (n + 1) * 1e6


# ---- the command -------------------------------------------------------------------------------

# ---- etcd and Kubernetes ---------------------------------------------------------------------


def bench_etcd(args: argparse.Namespace) -> list[Row]:
    """`LockOwner.keepalive` against the bare keepalive it wraps (the lease's refresh), on a real
    etcd, in rounds alternating the two (the best round of each); then one event's cost on the
    holder's thread (what keepalive and put add to etcd's round trip)."""
    from etcd3gw.client import Etcd3Client  # noqa: PLC0415

    from detector.adapters.etcd import LockOwner  # noqa: PLC0415
    from detector.contracts.events import Kind  # noqa: PLC0415
    from detector.devstack.etcd import LocalEtcd  # noqa: PLC0415

    n = max(args.keepalives, 1)
    sink = discarding_sink("etcd")
    with LocalEtcd() as server:
        client = Etcd3Client(host="127.0.0.1", port=server.port)
        lock = client.lock("bench", ttl=60)
        assert lock.acquire()
        assert lock.lease is not None
        lease = lock.lease
        with LockOwner.of_lock(client, lock, sink) as owner:
            bare: list[Cost] = []
            wrapped: list[Cost] = []
            for r in range(args.rounds):  # each first in every other round
                if r % 2:
                    wrapped.append(_per_call(owner.keepalive, n))
                bare.append(_per_call(lease.refresh, n))
                if not r % 2:
                    wrapped.append(_per_call(owner.keepalive, n))
            assert owner.ownership is not None
            ownership = owner.ownership

            def one_event() -> None:
                ownership.emit(Kind.HEARTBEAT, seq=1)

            per_event, _ = _per_call(one_event, args.events)
    sink.close()
    base_cpu, with_cpu = _best(bare, 0), _best(wrapped, 0)
    base_wall, with_wall = _best(bare, 1), _best(wrapped, 1)
    rounds = f"best of {args.rounds} rounds of {n}"
    return [
        Row("etcd", "keepalive, holder thread's CPU, lease.refresh()", base_cpu, "us", note=rounds),
        Row("etcd", "keepalive, holder thread's CPU, LockOwner.keepalive()", with_cpu, "us"),
        Row("etcd", "overhead per keepalive, CPU", _pct(with_cpu, base_cpu), "%", 5.0),
        Row("etcd", "keepalive, wall, lease.refresh()", base_wall, "us"),
        Row("etcd", "keepalive, wall, LockOwner.keepalive()", with_wall, "us"),
        Row("etcd", "overhead per keepalive, wall", _pct(with_wall, base_wall), "%", 5.0),
        Row("etcd", "per event, holder thread's CPU", per_event, "us", 50.0),
    ]


def bench_kubernetes(args: argparse.Namespace) -> list[Row]:
    """What `LeaderElector` adds to the leader's work: its effect calls carry the Lease through
    the context (no server: the elector's own writes are the Python client's)."""
    from detector.adapters import Authority, Ownership, effect_committed, owning  # noqa: PLC0415

    sink = discarding_sink("kubernetes")
    ownership = Ownership(
        sink, "default/bench", 41, "pod-a", Authority.SYSTEM, "kubernetes.resourceVersion"
    )

    def bare() -> None:
        pass

    def effect() -> None:
        effect_committed("charge/42", destination="psp")

    base, _ = _per_call(bare, args.events)
    with owning(ownership):
        per_event, wall = _per_call(effect, args.events)
    sink.close()
    return [
        Row(
            "kubernetes",
            "effect_committed in LeaderElector's work, CPU",
            per_event - base,
            "us",
            50.0,
        ),
        Row("kubernetes", "effect_committed, wall (the load adds to it)", wall, "us"),
    ]


def bench_redis_lock(args: argparse.Namespace) -> list[Row]:
    """A no-op unit of work under a redis-py lock (acquire, nothing, release) and an `extend`,
    with redis-py's `Lock` and with `FencedLock`, on a real redis-server, in rounds alternating
    the two (the best round of each); then one event's cost on the holder's thread."""
    import redis  # noqa: PLC0415

    from detector.adapters.redis_lock import fenced_lock_class  # noqa: PLC0415
    from detector.contracts.events import Kind  # noqa: PLC0415
    from detector.devstack.redis import LocalRedis  # noqa: PLC0415

    n = max(args.locks, 1)
    sink = discarding_sink("redis-lock")
    fenced = fenced_lock_class(sink, worker_id="bench")
    with LocalRedis() as server:
        client = redis.Redis.from_url(server.url)
        plain_lock = client.lock("bench-plain", timeout=60)
        fenced_lock = client.lock("bench-fenced", timeout=60, lock_class=fenced)

        def unit_of(lock: Any) -> Callable[[], None]:
            def unit() -> None:
                lock.acquire()
                lock.release()

            return unit

        def extend_of(lock: Any) -> Callable[[], object]:
            return lambda: lock.extend(60, replace_ttl=True)

        costs: dict[str, tuple[list[Cost], list[Cost]]] = {"unit": ([], []), "extend": ([], [])}
        for r in range(args.rounds):  # each first in every other round
            for which, (bare, wrapped) in costs.items():
                make = unit_of if which == "unit" else extend_of
                if which == "extend":
                    plain_lock.acquire()
                    fenced_lock.acquire()
                if r % 2:
                    wrapped.append(_per_call(make(fenced_lock), n))
                bare.append(_per_call(make(plain_lock), n))
                if not r % 2:
                    wrapped.append(_per_call(make(fenced_lock), n))
                if which == "extend":
                    plain_lock.release()
                    fenced_lock.release()
        assert fenced_lock.acquire()
        ownership = fenced_lock.ownership
        assert ownership is not None

        def one_event() -> None:
            ownership.emit(Kind.HEARTBEAT)

        per_event, _ = _per_call(one_event, args.events)
        fenced_lock.release()

        def reported() -> None:  # the adapter's own work per unit, without Redis
            fenced_lock._acquired(1, fenced_lock._lock_named())
            fenced_lock._ended(released=True)

        own = min(_per_call(reported, n)[0] for _ in range(args.rounds))
        client.close()
    sink.close()
    rounds = f"best of {args.rounds} rounds of {n}"
    rows = []
    for which, (bare, wrapped) in costs.items():
        what = "no-op unit (acquire + release)" if which == "unit" else "extend"
        base_cpu, with_cpu = _best(bare, 0), _best(wrapped, 0)
        base_wall, with_wall = _best(bare, 1), _best(wrapped, 1)
        rows += [
            Row("redis-lock", f"{what}, CPU, Lock", base_cpu, "us", note=rounds),
            Row("redis-lock", f"{what}, CPU, FencedLock", with_cpu, "us"),
            Row("redis-lock", f"overhead per {which}, CPU", _pct(with_cpu, base_cpu), "%", 5.0),
            Row("redis-lock", f"{what}, wall, Lock", base_wall, "us"),
            Row("redis-lock", f"{what}, wall, FencedLock", with_wall, "us"),
            Row("redis-lock", f"overhead per {which}, wall", _pct(with_wall, base_wall), "%", 5.0),
        ]
    base_unit = _best(costs["unit"][0], 0)
    return [
        *rows,
        Row("redis-lock", "the adapter's own work per unit, CPU", own, "us", note="2 events"),
        Row("redis-lock", "  as a share of the no-op unit, CPU", own / base_unit * 100, "%", 5.0),
        Row("redis-lock", "per event, holder thread's CPU", per_event, "us", 50.0),
    ]


def bench_kafka_consumer(args: argparse.Namespace) -> list[Row]:
    """Records consumed from a real broker by a consumer loop with a no-op body, without and
    with `ConsumerWatch.processing` around it, in rounds alternating the two (each round a new
    group reading the topic from its start; the best round of each); then one effect event's
    cost on the consumer's thread."""
    from detector.adapters import Authority, Ownership, effect_committed, owning  # noqa: PLC0415

    n = max(args.records, 1)
    sink = discarding_sink("kafka-consumer")
    bare, wrapped = _kafka_consumer_rounds(args, sink, n)
    ownership = Ownership(sink, "g/t/0", 1, "bench", Authority.SYSTEM, "kafka.group_generation")

    def effect() -> None:
        effect_committed("t/0/1", destination="db")

    with owning(ownership):
        per_event, _ = _per_call(effect, args.events)
    sink.close()
    base_cpu, with_cpu = _best(bare, 0), _best(wrapped, 0)
    base_wall, with_wall = _best(bare, 1), _best(wrapped, 1)
    rounds = f"best of {args.rounds} rounds of {n} records"
    return [
        Row("kafka-cons", "no-op record, CPU, bare loop", base_cpu, "us", note=rounds),
        Row("kafka-cons", "no-op record, CPU, watch.processing", with_cpu, "us"),
        Row("kafka-cons", "overhead per record, CPU", _pct(with_cpu, base_cpu), "%", 5.0),
        Row("kafka-cons", "no-op record, wall, bare loop", base_wall, "us"),
        Row("kafka-cons", "no-op record, wall, watch.processing", with_wall, "us"),
        Row("kafka-cons", "overhead per record, wall", _pct(with_wall, base_wall), "%", 5.0),
        Row("kafka-cons", "per effect event, consumer thread's CPU", per_event, "us", 50.0),
    ]


def _kafka_consumer_rounds(
    args: argparse.Namespace, sink: AdapterSink, n: int
) -> tuple[list[Cost], list[Cost]]:
    """Per record: the loop's costs without and with the watch, each round a fresh group."""
    import tempfile  # noqa: PLC0415

    from confluent_kafka import Consumer, Producer  # noqa: PLC0415
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # noqa: PLC0415

    from detector.adapters.kafka_consumer import ConsumerWatch  # noqa: PLC0415
    from detector.devstack.kafka import LocalKafka  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as directory:
        broker = LocalKafka(directory)
        broker.start()
        try:
            config: dict[str, Any] = dict(broker.client_config())
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            create_topics(config, [NewTopic(topic, 1, 1)], 60)
            producer = Producer(config)
            for i in range(n):
                producer.produce(topic, str(i).encode())
                producer.poll(0)
            assert producer.flush(60) == 0

            def consume(watched: bool) -> Cost:
                group = f"bench-{uuid.uuid4().hex[:8]}"
                consumer = Consumer(
                    {**config, "group.id": group, "auto.offset.reset": "earliest"}
                    | {"enable.auto.commit": False}
                )
                watch = ConsumerWatch(consumer, group, sink=sink, worker_id="bench")
                watch.subscribe([topic])
                got = 0
                cpu = wall = 0.0
                while got < n:  # the clock runs from the first record: joining is not the loop
                    msg = consumer.poll(1.0)
                    if msg is None or msg.error() is not None:
                        continue
                    if got == 0:
                        cpu, wall = time.thread_time(), time.perf_counter()
                    got += 1
                    if watched:
                        with watch.processing(msg):
                            pass
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                consumer.close()
                return cpu / max(n - 1, 1) * 1e6, wall / max(n - 1, 1) * 1e6

            bare: list[Cost] = []
            wrapped: list[Cost] = []
            for r in range(args.rounds):  # each first in every other round
                if r % 2:
                    wrapped.append(consume(True))
                bare.append(consume(False))
                if not r % 2:
                    wrapped.append(consume(True))
            return bare, wrapped
        finally:
            broker.stop()


def _per_call(call: Callable[[], object], n: int) -> Cost:
    """µs per call of `call`: the calling thread's CPU, and wall time."""
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(n):
        call()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    return cpu / n * 1e6, wall / n * 1e6


BENCHES: dict[str, Callable[[argparse.Namespace], list[Row]]] = {
    "temporal": bench_temporal,
    "langgraph": bench_langgraph,
    "celery": bench_celery,
    "etcd": bench_etcd,
    "kubernetes": bench_kubernetes,
    "redis-lock": bench_redis_lock,
    "kafka-consumer": bench_kafka_consumer,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHES), default=sorted(BENCHES))
    parser.add_argument(
        "--activities",
        type=int,
        default=200,
        help="activities, and workflows, per round (Temporal)",
    )
    parser.add_argument("--tasks", type=int, default=500, help="per round (Celery)")
    parser.add_argument("--invocations", type=int, default=200, help="per round (LangGraph)")
    parser.add_argument("--keepalives", type=int, default=200, help="per round (etcd)")
    parser.add_argument("--locks", type=int, default=500, help="per round (redis-lock)")
    parser.add_argument("--records", type=int, default=20_000, help="per round (kafka-consumer)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--events", type=int, default=20_000, help="per-event loop length")
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{platform.python_implementation()} {platform.python_version()}, load {load}")
    for name in args.only:
        for row in BENCHES[name](args):
            print(row.line(), flush=True)


if __name__ == "__main__":
    main()
