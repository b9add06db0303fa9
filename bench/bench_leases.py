"""The lease store (issue 10) against a real local PostgreSQL and a real local broker.

1. Claims and extends per second, with p50/p99 per call, at 1, 4 and 16 workers: threads of one
   process, each with its own `LeaseStore` (its own connection), as a worker runs its heartbeats;
   and the same counts above 1 as processes, to show whether the GIL is what bounds the threads.
   Beside the claims, in the same run, the physical limit: a bare `SELECT ... FOR UPDATE SKIP
   LOCKED` + `UPDATE` loop on the same table, and the store's claim rate as a fraction of it.
2. The outbox relay's throughput: the outbox filled with whole job lives (claim, two extends,
   complete), then drained by `relay_until_empty` to a fresh topic at two batch sizes.
3. The lag from a transition's commit (taken right after `claim`/`extend` returns) to its event
   being read from the topic, with `OutboxRelay.run` relaying at its default idle interval.
4. Jobs end to end per second with one `Runner` at 1, 4 and 16 concurrent jobs, beside the bare
   `SKIP LOCKED` loop on as many threads in the same run.
5. The wake-up at idle, enqueue → claim on the database's clock, with LISTEN/NOTIFY and with the
   poll alone.

PostgreSQL (Debian's binaries, `detector/devstack/postgres.py`) and the broker each run in a temp
directory and are stopped at the end. Prints numbers; asserts nothing.
Run: `python bench/bench_leases.py [--quick] [--workers 1,4,16] [--jobs N] [--parts P,...]`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import multiprocessing
import os
import platform
import queue
import random
import resource
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from stack import broker_with_topics

from detector.contracts.events import parse_event_obj
from detector.devstack.kafka import LocalKafka
from detector.devstack.postgres import LocalPostgres
from detector.devstack.topics import WorkerTopics, end_offsets
from detector.leases import JobClass, Lease, LeaseLost, LeaseStore, Runner, ToolCall, migrate
from detector.leases.db import connect
from detector.leases.relay import OutboxRelay, relay_until_empty

Mode = Literal["claim", "extend", "bare"]
# The physical limit a claim is compared with: the least a SKIP LOCKED queue does per claim, one
# transaction of a SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE, with no outbox, no reaping,
# no lease arithmetic and no event.
_BARE_PICK = (
    "SELECT id FROM tool_jobs WHERE job_class = %s AND state = 'queued'"
    " ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
)
_BARE_TAKE = (
    "UPDATE tool_jobs SET state = 'running', owner_id = %s, fencing_token = fencing_token + 1,"
    " attempt = attempt + 1, lease_until = now() + interval '300 s' WHERE id = %s"
)


def bare_claim(conn: Any, name: str, owner: str) -> bool:
    with conn.transaction():
        row = conn.execute(_BARE_PICK, (name,)).fetchone()
        if row is None:
            return False
        conn.execute(_BARE_TAKE, (owner, row["id"]))
    return True


PARTS = ("claims", "runners", "wakeups", "relay", "lag")
PARTITIONS = 6  # `topics apply --profile local` gives agent.ownership.v1 six partitions
FILL_THREADS = 4
BARRIER_S = 120.0  # a worker that cannot connect breaks the barrier instead of hanging the rest


def job_class(name: str) -> JobClass:
    """Leases far longer than any run, so that nothing expires and nothing is reaped."""
    return JobClass(
        name=name,
        lease_s=300,
        heartbeat_s=10,
        missed_heartbeats=3,
        reserve_s=15,
        max_attempts=3,
        tool_timeout_s=60,
        stage_time_limit_s=600,
    )


@dataclass(frozen=True, slots=True)
class Sample:
    """One worker's run: seconds per call and when each call returned, and when it started after
    the barrier and ended (perf_counter: one clock for all processes)."""

    latencies: list[float]
    returned: list[float]
    start: float
    end: float


def pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (defined for any non-empty list)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def default(function: Callable[..., Any], name: str) -> Any:
    """A parameter's default as the code has it now (the relay's batch and idle interval)."""
    return inspect.signature(function).parameters[name].default


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cpus)"


# -- the database -----------------------------------------------------------------------------


def reset(dsn: str) -> None:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE tool_jobs CASCADE")  # the outbox, and whatever else refers to jobs


def enqueue(dsn: str, name: str, n: int) -> None:
    """`n` queued jobs of class `name`, in one statement: the rows `LeaseStore.enqueue` writes
    (which appends no event), without a transaction each. Then VACUUM ANALYZE, so that every run
    starts from fresh statistics and no dead rows."""
    with connect(dsn) as conn:
        conn.execute(
            "INSERT INTO tool_jobs (job_class, idempotency_key, payload, tool_class)"
            " SELECT %(name)s, %(name)s || ':' || g, jsonb_build_object('doc', g), 'bench'"
            "   FROM generate_series(1, %(n)s) AS g",
            {"name": name, "n": n},
        )
        conn.execute("VACUUM ANALYZE tool_jobs")


def settings(dsn: str) -> str:
    with connect(dsn) as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()
            for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers")
        }
    return ", ".join(f"{k}={row[k] if row else '?'}" for k, row in shown.items())


# -- 1. claims and extends --------------------------------------------------------------------


def drive(
    dsn: str, policy: JobClass, owner: str, mode: Mode, seconds: float, barrier: Any
) -> Sample:
    """One worker: claim until none is left, or extend its own lease for `seconds`."""
    latencies: list[float] = []
    returned: list[float] = []
    if mode == "bare":
        with connect(dsn) as conn:
            barrier.wait()
            start = end = time.perf_counter()
            while True:
                before = time.perf_counter()
                took = bare_claim(conn, policy.name, owner)
                end = time.perf_counter()
                if not took:
                    break
                latencies.append(end - before)
                returned.append(end)
        return Sample(latencies, returned, start, end)
    with LeaseStore(dsn, [policy]) as store:
        held = store.claim(policy.name, owner) if mode == "extend" else None
        barrier.wait()
        start = end = time.perf_counter()
        if mode == "claim":
            while True:
                before = time.perf_counter()
                lease = store.claim(policy.name, owner)
                end = time.perf_counter()
                if lease is None:
                    break
                latencies.append(end - before)
                returned.append(end)
        else:
            assert held is not None, "no job to hold"
            lease_held: Lease = held
            while end < start + seconds:
                before = time.perf_counter()
                answer = store.extend(lease_held)
                end = time.perf_counter()
                if isinstance(answer, LeaseLost):
                    raise SystemExit(f"{owner} lost its lease during the bench")
                lease_held = answer
                latencies.append(end - before)
                returned.append(end)
    return Sample(latencies, returned, start, end)


def in_threads(
    dsn: str, policy: JobClass, workers: int, mode: Mode, seconds: float
) -> list[Sample]:
    barrier = threading.Barrier(workers, timeout=BARRIER_S)
    samples: list[Sample] = []
    failures: list[BaseException] = []

    def one(i: int) -> None:
        try:
            samples.append(drive(dsn, policy, f"w{i}", mode, seconds, barrier))
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return samples


def _process_main(
    results: Any, dsn: str, policy: JobClass, owner: str, mode: Mode, seconds: float, barrier: Any
) -> None:
    results.put(drive(dsn, policy, owner, mode, seconds, barrier))


def in_processes(
    dsn: str, policy: JobClass, workers: int, mode: Mode, seconds: float
) -> list[Sample]:
    """Forked: phase 1 runs before any Kafka client (and its threads) exists in this process."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(workers, timeout=BARRIER_S)
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(
            target=_process_main, args=(results, dsn, policy, f"p{i}", mode, seconds, barrier)
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    samples: list[Sample] = []
    for _ in procs:
        try:
            got: Sample = results.get(timeout=600)
        except queue.Empty:
            raise SystemExit("a bench process gave no result within 10 minutes") from None
        samples.append(got)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a bench process exited with {p.exitcode}")
    return samples


@dataclass(frozen=True, slots=True)
class Rate:
    ops: int
    per_s: float
    p50_ms: float
    p99_ms: float


def rate(samples: list[Sample]) -> Rate:
    latencies = [x for s in samples for x in s.latencies]
    wall = max(s.end for s in samples) - min(s.start for s in samples)
    return Rate(
        len(latencies), len(latencies) / wall, 1000 * pct(latencies, 50), 1000 * pct(latencies, 99)
    )


def tenths(samples: list[Sample]) -> tuple[float, float]:
    """p50 (ms) of the first and the last tenth of the claims, by when each returned. The claims
    that come later pass over more rows: the jobs claimed before them are older, still running,
    and first in the claim index's order."""
    timed = sorted((at, x) for s in samples for at, x in zip(s.returned, s.latencies, strict=True))
    k = max(1, len(timed) // 10)
    return (
        1000 * statistics.median(x for _, x in timed[:k]),
        1000 * statistics.median(x for _, x in timed[-k:]),
    )


def claims_and_extends(dsn: str, args: argparse.Namespace) -> None:
    print(
        f"\n1. claims and extends: {args.jobs:,} queued jobs per run, each worker claims until "
        f"none is left (claimed jobs stay running); then each worker extends its own lease for "
        f"{args.seconds:g} s"
    )
    runs: list[tuple[str, Callable[..., list[Sample]], int]] = [
        ("threads", in_threads, w) for w in args.workers
    ]
    runs += [("processes", in_processes, w) for w in args.workers if w > 1]
    print(
        f"{'':19}{'claims':>38}{'bare SKIP LOCKED':>26}{'extends':>26}\n"
        f"{'mode':10}{'workers':>8}{'ops/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'p50 first→last tenth':>22}{'ops/s':>9}{'p50 ms':>9}{'claims/bare':>12}"
        f"{'ops/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
    )
    for kind, run, workers in runs:
        reset(dsn)
        claims = job_class(f"claims-{kind}-{workers}")
        extends = job_class(f"extends-{kind}-{workers}")
        enqueue(dsn, claims.name, args.jobs)
        claimed = run(dsn, claims, workers, "claim", 0.0)
        reset(dsn)
        bare_class = job_class(f"bare-{kind}-{workers}")
        enqueue(dsn, bare_class.name, args.jobs)
        bare = rate(run(dsn, bare_class, workers, "bare", 0.0))
        enqueue(dsn, extends.name, workers)
        extended = run(dsn, extends, workers, "extend", args.seconds)
        c, e = rate(claimed), rate(extended)
        first, last = tenths(claimed)
        if c.ops != args.jobs or bare.ops != args.jobs:
            raise SystemExit(f"{c.ops} claims and {bare.ops} bare claims of {args.jobs} jobs")
        print(
            f"{kind:10}{workers:>8}{c.per_s:>9,.0f}{c.p50_ms:>9.2f}{c.p99_ms:>9.2f}"
            f"{f'{first:.2f} → {last:.2f}':>22}{bare.per_s:>9,.0f}{bare.p50_ms:>9.2f}"
            f"{c.per_s / bare.per_s:>12.2f}{e.per_s:>9,.0f}{e.p50_ms:>9.2f}{e.p99_ms:>9.2f}"
        )
    print(
        "threads share one Python process and its GIL (psycopg releases it while it waits for "
        "the server):\nthe shape the store is built for (one store per thread; a worker's "
        "heartbeats are threads).\nprocesses are forked, one connection each, to show whether "
        "the GIL bounds the threads.\nthe server's backends run on the same cores."
    )


# -- 4. jobs end to end, and the wake-up -----------------------------------------------------


def run_jobs(dsn: str, policy: JobClass, jobs: int, concurrency: int) -> float:
    """Jobs/s of one `Runner` running `jobs` queued jobs with a tool that returns at once, from
    the first tool call to the last execution's end: claim, heartbeat thread, request start,
    tool, complete, for each."""
    calls: list[float] = []

    async def tool(call: ToolCall) -> dict[str, bool]:
        calls.append(time.perf_counter())
        if len(calls) == jobs:
            stop.set()  # every slot ends its job in hand, then the run returns
        return {"ok": True}

    async def run() -> int:
        runner = Runner(dsn, [policy], "bench")
        try:
            done = await runner.run(policy.name, tool, stop, concurrency=concurrency)
        finally:
            runner.close()
        return len(done)

    stop = asyncio.Event()
    executed = asyncio.run(run())
    end = time.perf_counter()
    if executed != jobs:
        raise SystemExit(f"{executed} executions of {jobs} jobs")
    return jobs / (end - calls[0])


def runners(dsn: str, args: argparse.Namespace) -> None:
    print(
        f"\n4. jobs end to end: {args.jobs:,} queued jobs run by one Runner at each concurrency "
        "(a tool that returns at once), beside the bare SKIP LOCKED loop on as many threads"
    )
    print(f"{'concurrent':>10}{'jobs/s':>9}{'bare claims/s':>15}{'jobs/bare':>11}")
    for n in args.concurrency:
        reset(dsn)
        policy = job_class(f"run-{n}")
        enqueue(dsn, policy.name, args.jobs)
        per_s = run_jobs(dsn, policy, args.jobs, n)
        reset(dsn)
        bare_class = job_class(f"bare-run-{n}")
        enqueue(dsn, bare_class.name, args.jobs)
        bare = rate(in_threads(dsn, bare_class, n, "bare", 0.0))
        print(f"{n:>10}{per_s:>9,.0f}{bare.per_s:>15,.0f}{per_s / bare.per_s:>11.2f}")
    print(
        "a bare claim is one transaction of two statements with no lease, no outbox and no "
        "result;\na job is a claim, a request start and a completion (three transactions, each "
        "with its outbox row) and a heartbeat thread"
    )


def wake_ms(dsn: str, count: int, *, listen: bool, idle_s: float) -> list[float]:
    """Enqueue → claim (ms) of `count` jobs enqueued one at a time to an idle `Runner`, each
    after the last one ran and a pause: the claim's `now()` (its `heartbeat_at`) minus the
    enqueue's (`created_at`), both the database's clock."""
    reset(dsn)
    policy = job_class(f"wake-{listen}")
    ran = threading.Event()
    pauses = random.Random(1)

    async def tool(call: ToolCall) -> None:
        ran.set()

    def produce(stop: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        with LeaseStore(dsn, [policy]) as store:
            time.sleep(1.0)  # the runner is idle and listening
            for n in range(count):
                time.sleep(pauses.uniform(0.05, 0.15))
                ran.clear()
                store.enqueue(policy.name, f"wake:{n}", {})
                if not ran.wait(30):
                    raise SystemExit(f"job {n} was not run within 30 s")
        loop.call_soon_threadsafe(stop.set)

    async def run() -> None:
        stop = asyncio.Event()
        runner = Runner(dsn, [policy], "bench")
        try:
            running = asyncio.create_task(
                runner.run(policy.name, tool, stop, idle_s=idle_s, listen=listen)
            )
            await asyncio.to_thread(produce, stop, asyncio.get_running_loop())
            await running
        finally:
            runner.close()

    asyncio.run(run())
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM heartbeat_at - created_at)::float8 * 1000 AS ms"
            " FROM tool_jobs WHERE job_class = %s",
            (policy.name,),
        ).fetchall()
    return [row["ms"] for row in rows]


def wakeups(dsn: str, args: argparse.Namespace) -> None:
    print(
        f"\n5. enqueue → claim at idle: {args.wakeups} jobs enqueued one at a time, each after "
        "the last one ran and a pause of 50 to 150 ms, to one idle Runner; on the database's "
        "clock"
    )
    poll_s = default(Runner.run, "idle_s")
    for listen, idle_s in ((True, 5.0), (False, poll_s)):
        ms = wake_ms(dsn, args.wakeups, listen=listen, idle_s=idle_s)
        how = "LISTEN/NOTIFY (poll 5 s)" if listen else f"poll only, every {1000 * idle_s:.0f} ms"
        print(
            f"{how:>28}: p50 {pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms, "
            f"max {max(ms):.1f} ms ({len(ms)} jobs)"
        )


# -- 2. the relay's throughput ----------------------------------------------------------------


def one_life(store: LeaseStore, name: str, owner: str) -> bool:
    """Claim, extend twice, complete: four transitions, four outbox rows. False: none left."""
    lease = store.claim(name, owner)
    if lease is None:
        return False
    for _ in range(2):
        answer = store.extend(lease)
        if isinstance(answer, LeaseLost):
            raise SystemExit(f"{owner} lost its lease during the fill")
    store.complete(lease, {"ok": True})
    return True


def fill(dsn: str, events: int) -> float:
    """`events` outbox rows from whole job lives; returns transitions per second."""
    reset(dsn)
    policy = job_class("relay")
    enqueue(dsn, policy.name, events // 4)

    failures: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            with LeaseStore(dsn, [policy]) as store:
                while one_life(store, policy.name, f"f{i}"):
                    pass
        except BaseException as exc:
            failures.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(FILL_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise failures[0]
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM tool_job_outbox").fetchone()
    if row is None or row["n"] != 4 * (events // 4):
        raise SystemExit(f"the fill wrote {row and row['n']} outbox rows, not {events}")
    return 4 * (events // 4) / elapsed


def fresh_topic(broker: LocalKafka, prefix: str) -> str:
    return WorkerTopics.fresh(prefix).create(broker.client_config(), PARTITIONS).input


def on_topic(broker: LocalKafka, topic: str) -> int:
    return sum(end_offsets(AdminClient(broker.client_config()), topic).values())


def parse_cost(dsn: str, n: int = 2000) -> float:
    """µs per event of what the relay's Emitter does in Python for each row before librdkafka:
    validate it as an ownership event and serialise it."""
    with connect(dsn) as conn:
        rows = conn.execute("SELECT event FROM tool_job_outbox LIMIT %s", (n,)).fetchall()
    started = time.perf_counter()
    for row in rows:
        parse_event_obj(row["event"]).model_dump_json(exclude_none=True)
    return 1e6 * (time.perf_counter() - started) / len(rows)


def drain(dsn: str, broker: LocalKafka, batch: int, label: str, rows: int) -> float:
    """Mark the oldest `rows` rows unrelayed (the rest relayed), and relay them to a fresh topic
    with `relay_until_empty`. Returns what a step that finds nothing costs then (ms): the
    relay's fixed cost per step."""
    with connect(dsn) as conn:
        conn.execute("UPDATE tool_job_outbox SET relayed_at = now()")
        conn.execute(
            "UPDATE tool_job_outbox SET relayed_at = NULL WHERE (job_id, seq) IN"
            " (SELECT job_id, seq FROM tool_job_outbox ORDER BY created_at, job_id, seq LIMIT %s)",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE tool_job_outbox")
    topic = fresh_topic(broker, "leases-relay")
    relay = OutboxRelay(dsn, broker.client_config(), topic=topic, batch=batch)
    try:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        published = relay_until_empty(relay, timeout_s=600)
        wall = time.perf_counter() - started
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        empty = []
        for _ in range(5):
            before = time.perf_counter()
            relay.step()
            empty.append(time.perf_counter() - before)
    finally:
        relay.close()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    steps = math.ceil(published / batch) + 1
    print(
        f"{label:10}{batch:>7}{published:>9,}{published / wall:>10,.0f}{1000 * wall / steps:>10.1f}"
        f"{100 * cpu / wall:>10.0f}%{on_topic(broker, topic):>10,}"
    )
    return 1000 * statistics.median(empty)


def relay_throughput(dsn: str, broker: LocalKafka, args: argparse.Namespace) -> None:
    print(
        f"\n2. relay throughput: {args.events:,} outbox rows (job lives: claim, 2 extends, "
        f"complete), drained by relay_until_empty to a fresh {PARTITIONS}-partition topic"
    )
    made = fill(dsn, args.events)
    print(
        f"fill: {made:,.0f} transitions/s ({FILL_THREADS} threads; each transition one "
        f"transaction with its outbox row)"
    )
    print(
        f"{'run':10}{'batch':>7}{'events':>9}{'events/s':>10}{'ms/step':>10}"
        f"{'relay CPU':>11}{'on topic':>10}"
    )
    # the broker's JIT, the producer's idempotence PID: not a measurement
    drain(dsn, broker, default(OutboxRelay, "batch"), "warm-up", min(args.events // 4, 2000))
    empty = [drain(dsn, broker, batch, "measured", args.events) for batch in args.batches]
    print(
        f"relay CPU: this process (the relay's Python thread and librdkafka's) per wall second.\n"
        f"per event, validating and serialising it in Python (Emitter.emit): "
        f"{parse_cost(dsn):.0f} µs; a step that finds nothing (the pending query and the prune, "
        f"on {args.events:,} relayed rows): {statistics.median(empty):.1f} ms"
    )


# -- 3. the lag from commit to topic ----------------------------------------------------------


class Tail(threading.Thread):
    """Reads the topic from its beginning; records when each event id was first read."""

    def __init__(self, broker: LocalKafka, topic: str) -> None:
        super().__init__(daemon=True)
        self.read_at: dict[str, float] = {}
        self.stop = threading.Event()
        self._consumer = Consumer(
            {
                **broker.client_config(),
                "group.id": f"bench-{topic}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msgs = self._consumer.consume(500, timeout=0.05)
                now = time.perf_counter()
                for msg in msgs:
                    value = msg.value()
                    if msg.error() is None and value is not None:
                        self.read_at.setdefault(json.loads(value)["event_id"], now)
        finally:
            self._consumer.close()


def paced(store: LeaseStore, name: str, count: int, per_s: float) -> dict[str, float]:
    """`count` transitions at `per_s`: a claim, then three extends of that lease, and again.
    Returns each transition's event id and the time its call returned (its commit)."""
    committed: dict[str, float] = {}
    lease: Lease | None = None
    seq = 0
    started = time.perf_counter()
    for i in range(count):
        wait = started + i / per_s - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        if lease is None or seq == 4:
            lease, seq = store.claim(name, "lag"), 1
            if lease is None:
                raise SystemExit("ran out of jobs")
        else:
            answer = store.extend(lease)
            if isinstance(answer, LeaseLost):
                raise SystemExit("lost a lease during the bench")
            lease, seq = answer, seq + 1
        committed[f"{lease.job_id}:{seq}"] = time.perf_counter()
    return committed


def lag(dsn: str, broker: LocalKafka, args: argparse.Namespace) -> None:
    idle_s = default(OutboxRelay.run, "idle_s")
    warm = int(args.lag_rate)  # one second, not counted
    count = int(args.lag_rate * args.lag_seconds)
    print(
        f"\n3. commit → event read from the topic: {args.lag_rate:g} transitions/s for "
        f"{args.lag_seconds:g} s (claim, then 3 extends), one relay (OutboxRelay.run, batch "
        f"{default(OutboxRelay, 'batch')}, idle poll {1000 * idle_s:.0f} ms) and one consumer "
        f"(fetch.wait.max.ms 10); after 1 s of warm-up"
    )
    reset(dsn)
    policy = job_class("lag")
    enqueue(dsn, policy.name, (warm + count) // 4 + 2)
    topic = fresh_topic(broker, "leases-lag")
    relay = OutboxRelay(dsn, broker.client_config(), topic=topic)
    stop = threading.Event()
    relaying = threading.Thread(target=relay.run, args=(stop,))
    tail = Tail(broker, topic)
    relaying.start()
    tail.start()
    try:
        with LeaseStore(dsn, [policy]) as store:
            paced(store, policy.name, warm, args.lag_rate)
            committed = paced(store, policy.name, count, args.lag_rate)
        deadline = time.monotonic() + 60
        while not committed.keys() <= tail.read_at.keys():
            if time.monotonic() > deadline:
                missing = len(committed.keys() - tail.read_at.keys())
                raise SystemExit(f"{missing} events not on the topic after 60 s")
            time.sleep(0.05)
    finally:
        stop.set()
        relaying.join()
        relay.close()
        tail.stop.set()
        tail.join()
    lags = [1000 * (tail.read_at[k] - t) for k, t in committed.items()]
    print(
        f"{len(lags)} transitions: p50 {pct(lags, 50):.0f} ms, p95 {pct(lags, 95):.0f} ms, "
        f"p99 {pct(lags, 99):.0f} ms, max {max(lags):.0f} ms (min {min(lags):.0f} ms)"
    )
    print(
        f"an idle relay looks every {1000 * idle_s:.0f} ms: a transition waits up to that for "
        f"the next look, then one step (select, produce, acks=all, mark, prune) and the fetch"
    )


# -- main -------------------------------------------------------------------------------------


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run (< 60 s)")
    ap.add_argument("--workers", type=numbers, help="worker counts (default 1,4,16; quick 1,4)")
    ap.add_argument("--jobs", type=int, help="queued jobs per claims run (default 2000)")
    ap.add_argument("--seconds", type=float, help="extends per run (default 3 s)")
    ap.add_argument("--events", type=int, help="outbox rows for the relay (default 20000)")
    ap.add_argument("--batches", type=numbers, default=[100, 500], help="relay batch sizes")
    ap.add_argument("--lag-rate", type=float, default=50.0, help="transitions/s for the lag")
    ap.add_argument("--lag-seconds", type=float, help="duration of the lag run (default 10 s)")
    ap.add_argument("--concurrency", type=numbers, help="jobs at once per Runner (1,4,16)")
    ap.add_argument("--wakeups", type=int, help="jobs enqueued at idle, each way (default 200)")
    ap.add_argument(
        "--parts",
        type=lambda text: set(text.split(",")),
        default=set(PARTS),
        help=f"what to run, of {','.join(PARTS)} (default all; relay and lag start a broker)",
    )
    args = ap.parse_args()
    defaults: dict[str, Any] = (
        {"workers": [1, 4], "jobs": 300, "seconds": 1.0, "events": 2000, "lag_seconds": 3.0}
        | {"concurrency": [1, 4], "wakeups": 30}
        if args.quick
        else {"workers": [1, 4, 16], "jobs": 2000, "seconds": 3.0, "events": 20_000}
        | {"lag_seconds": 10.0, "concurrency": [1, 4, 16], "wakeups": 200}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    began = time.perf_counter()
    print(f"start: {load()}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, python "
        f"{platform.python_version()}; PostgreSQL and the broker on the same machine"
    )
    with LocalPostgres() as postgres:
        dsn = postgres.create_database("bench")
        with connect(dsn) as conn:
            migrate(conn)
        print(f"PostgreSQL: {settings(dsn)}")
        if "claims" in args.parts:
            claims_and_extends(dsn, args)  # before the broker: no Kafka client threads to fork
        if "runners" in args.parts:
            runners(dsn, args)
        if "wakeups" in args.parts:
            wakeups(dsn, args)
        if args.parts & {"relay", "lag"}:
            with broker_with_topics("leases", PARTITIONS) as (broker, _):
                if "relay" in args.parts:
                    relay_throughput(dsn, broker, args)
                if "lag" in args.parts:
                    lag(dsn, broker, args)
    print(f"\nend: {load()}; wall time {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
