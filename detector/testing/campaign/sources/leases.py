"""The lease store's campaign: the product's own job queue on a real PostgreSQL.

The session starts PostgreSQL (`detector.devstack.postgres`), migrates the store and runs the
outbox relay (`splitbrain leases relay`) to the campaign's input topic. Each run has a job class
and a destination of its own, and three workers (`leases_worker`, each reaching the database
through a `TcpProxy` of its own, its wall clock under libfaketime) over a stream of jobs, each
of which makes one effect. Even runs use an unfenced destination (a displaced owner's effect
commits: `stale_effect_committed`, and the failover duplicates), odd runs the fenced one (it is
refused: `stale_effect_rejected`).

The truth is `tool_jobs.fencing_token` (and the job's state) read in the effect's own
transaction, under the job's row lock, and the token a fenced destination compared a refused
fence with; the job table is the result's destination, and a displaced owner's result it refused
is a stale write too (`leases_worker`).

Faults: a pause past the lease (SIGSTOP inside the tool's call: the zombie), crash and restart,
graceful shutdown, a partition between one worker and PostgreSQL, a retry after the tool raised
a retryable `ToolFailed` before its effect, a handoff (an operator cancels the job a worker runs,
through the store's cancel, and submits the work again), a PostgreSQL restart and a stepped
clock on one worker.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import DictRow

from detector.devstack.needs import missing_program
from detector.devstack.postgres import LocalPostgres, postgres_binaries
from detector.leases import JobClass, Labels, LeaseStore, StoreUnavailableError, migrate
from detector.leases.db import connect, one_line
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.leases_worker import NO_TAKEOVER, SCHEMA, export
from detector.testing.campaign.nemesis import (
    Fault,
    Proc,
    Step,
    clock_env,
    faketime_library,
    step_clock,
)
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.proxy import TcpProxy

log = logging.getLogger(__name__)

WORKERS: Final = 3
UNITS: Final = 30  # jobs a run submits, one every EVERY_S
EVERY_S: Final = 0.4
WORK_S: Final = "0.6:1.4"  # a tool call's work before its effect
LEASE_S: Final = 2.0
RELAYED_S: Final = 60.0  # for the outbox to be published after a run
READY_S: Final = 60.0  # for a run's workers to start
# The faults whose hold is a time they last (a clock step's is its size, in hours).
_HELD: Final = frozenset(
    {
        Fault.PAUSE_PAST_LEASE,
        Fault.CRASH_RESTART,
        Fault.GRACEFUL_SHUTDOWN,
        Fault.PARTITION,
        Fault.COORDINATOR_RESTART,
    }
)
_UNFINISHED: Final = """
SELECT count(*) AS n FROM tool_jobs WHERE job_class = %s AND state IN ('queued', 'running')
"""
_UNRELAYED: Final = "SELECT count(*) AS n FROM tool_job_outbox WHERE relayed_at IS NULL"
_RUNNING: Final = """
SELECT id, idempotency_key, payload FROM tool_jobs
 WHERE job_class = %s AND state = 'running' AND owner_id = %s
"""


def job_class(run: int) -> JobClass:
    """A run's class: a 2 s lease (L=2 > H + R x max(H, T) + J = 0.4 + 2 x 0.4 + 0.5), attempts
    enough that no job runs out of them under the nemesis, and a tool timeout well past the
    longest pause (the tool's call, not the runner's clock, decides what a zombie does)."""
    return JobClass(
        name=f"campaign-{run}",
        lease_s=LEASE_S,
        heartbeat_s=0.4,
        missed_heartbeats=2,
        reserve_s=0.5,
        extend_timeout_s=0.2,  # on loopback a dropped or stopped server refuses at once
        max_attempts=20,
        tool_timeout_s=30,
        stage_time_limit_s=60,
        retry_backoff_s=0.2,
        retry_backoff_max_s=1.0,
    )


class LeasesSource:
    name = "leases"
    faults = frozenset(
        {
            Fault.PAUSE_PAST_LEASE,
            Fault.CRASH_RESTART,
            Fault.GRACEFUL_SHUTDOWN,
            Fault.PARTITION,
            Fault.EXCEPTION_RETRY,
            Fault.HANDOFF,
            Fault.COORDINATOR_RESTART,
            Fault.CLOCK_STEP,
        }
    )
    holds: Mapping[Fault, tuple[float, float]] = {
        Fault.PAUSE_PAST_LEASE: (LEASE_S + 1.0, LEASE_S + 4.0),
        Fault.CRASH_RESTART: (0.5, 3.0),
        Fault.GRACEFUL_SHUTDOWN: (0.5, 3.0),
        Fault.PARTITION: (1.0, LEASE_S + 4.0),
        Fault.COORDINATOR_RESTART: (1.0, 4.0),
        Fault.BROKER_RESTART: (1.0, 5.0),
        Fault.CLOCK_STEP: (-6.0, 6.0),  # hours, either way
    }
    workers = WORKERS
    span_s = UNITS * EVERY_S
    steps = 4
    grade = Grade(ordering="authoritative_seq", destination_confirms=True)
    blind: Mapping[str, str] = {
        NO_TAKEOVER: "the store failed the job for good (its attempts used up) without issuing "
        "a new token, so no acquisition displaced the writer: nothing its events show makes "
        "the write stale",
    }

    def missing(self) -> str | None:
        if lacking := missing_program("PostgreSQL", postgres_binaries):
            return lacking
        if faketime_library() is None:
            return "libfaketime is missing: install Debian's faketime package"
        return None

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[_Session]:
        with LocalPostgres() as server:
            dsn = server.create_database("campaign")
            with connect(dsn) as conn:
                migrate(conn)
                conn.execute(SCHEMA)
            argv = [sys.executable, "-m", "detector.cli", "leases", "relay"]
            relay = Proc(
                "relay",
                [*argv, "--topic", env.input_topic],
                env.process_env(SPLITBRAIN_LEASES_DSN=dsn),
                env.workdir / "relay.log",
            )
            relay.start()
            try:
                yield _Session(server, dsn, relay)
            finally:
                relay.stop()


def source() -> LeasesSource:
    return LeasesSource()


@dataclass
class _Session:
    server: LocalPostgres
    dsn: str
    relay: Proc
    _restarting: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[_Fleet]:
        fleet = _Fleet(self, env, fenced=env.run % 2 == 1)
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.stop()
            self._wait_relayed()
            export(self.dsn, fleet.destination, fleet.job_class.name, env.truth)

    def restart_later(self, down_s: float) -> threading.Thread:
        """Stop PostgreSQL now and start it `down_s` later, without holding up the schedule."""

        def bounce() -> None:
            with self._restarting:
                self.server.stop()
                time.sleep(down_s)
                self.server.start()

        thread = threading.Thread(target=bounce, name="campaign-postgres", daemon=True)
        thread.start()
        return thread

    def one(self, query: str, params: tuple[object, ...] = ()) -> DictRow | None:
        """One row of `query`, on a connection of its own (`StoreUnavailableError`: PostgreSQL
        did not answer, as while it restarts)."""
        with connect(self.dsn) as conn:
            try:
                return conn.execute(query, params).fetchone()
            except psycopg.OperationalError as exc:
                raise StoreUnavailableError(one_line(exc)) from exc

    def _wait_relayed(self) -> None:
        """Until the relay has published every event of the run."""
        deadline = time.monotonic() + RELAYED_S
        while (row := self.one(_UNRELAYED)) and row["n"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the relay left {row['n']} event(s) unpublished")
            time.sleep(0.2)


class _Fleet:
    """One run's workers, the stream of its jobs, and the means of its faults."""

    def __init__(self, session: _Session, env: RunEnv, *, fenced: bool) -> None:
        self._session = session
        self._env = env
        self.job_class = job_class(env.run)
        self.destination = f"campaign-{env.run}"
        self._proxies = [TcpProxy("127.0.0.1", session.server.port) for _ in range(WORKERS)]
        self._clocks = [env.workdir / f"clock-w{i}" for i in range(WORKERS)]
        self._flags = [env.workdir / f"fail-w{i}" for i in range(WORKERS)]
        self._procs = [self._worker(i, fenced) for i in range(WORKERS)]
        self._timers: list[threading.Timer] = []
        self._healed = 0.0  # when the last fault's hold ends (monotonic)
        self._restarts: list[threading.Thread] = []
        self._store = LeaseStore(session.dsn, [self.job_class])
        self._feeder = threading.Thread(target=self._feed, name="campaign-jobs", daemon=True)

    def start(self) -> None:
        for proc in self._procs:
            proc.start()
        self._ready()
        self._feeder.start()

    def _ready(self) -> None:
        """Until every worker has reached the store: the schedule starts when they work."""
        deadline = time.monotonic() + READY_S
        while not all((self._env.workdir / f"ready-w{i}").exists() for i in range(WORKERS)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not start in {READY_S:g}s")
            time.sleep(0.1)

    def _worker(self, i: int, fenced: bool) -> Proc:
        dsn = make_conninfo(self._session.dsn, port=str(self._proxies[i].port), connect_timeout="2")
        return Proc(
            f"w{i}",
            [
                *(sys.executable, "-m", "detector.testing.campaign.leases_worker"),
                *("--worker-id", f"w{i}", "--job-class", self.job_class.model_dump_json()),
                *("--destination", self.destination, "--fail-flag", str(self._flags[i])),
                *("--ready", str(self._env.workdir / f"ready-w{i}")),
                *("--work-s", WORK_S, "--seed", str(self._env.rng.randrange(2**31))),
                *(() if fenced else ("--unfenced",)),
            ],
            self._env.process_env(SPLITBRAIN_LEASES_DSN=dsn, **clock_env(self._clocks[i])),
            self._env.workdir / f"w{i}.log",
        )

    def _feed(self) -> None:
        """Submit the run's jobs, one every EVERY_S, through any PostgreSQL restart."""
        began = time.monotonic()
        with LeaseStore(self._session.dsn, [self.job_class]) as store:
            for unit in range(UNITS):
                time.sleep(max(0.0, began + unit * EVERY_S - time.monotonic()))
                self._submit(store, f"r{self._env.run}-u{unit}", {"entity": f"account-{unit}"})

    def _submit(self, store: LeaseStore, key: str, payload: dict[str, str]) -> None:
        while True:
            try:
                store.enqueue(self.job_class.name, key, payload, Labels(tool_class="campaign"))
                return
            except StoreUnavailableError:
                time.sleep(0.2)

    def apply(self, step: Step) -> None:
        with (self._env.workdir / "faults.log").open("a") as out:
            out.write(f"{time.time():.3f} {step.describe()}\n")
        i = step.target
        if step.fault in _HELD:
            self._healed = max(self._healed, time.monotonic() + step.hold_s)
        if self._procs[i].apply(step):
            return
        match step.fault:
            case Fault.PARTITION:
                self._proxies[i].cut()
                timer = threading.Timer(step.hold_s, self._proxies[i].restore)
                timer.daemon = True
                timer.start()
                self._timers.append(timer)
            case Fault.EXCEPTION_RETRY:
                self._flags[i].touch()
            case Fault.HANDOFF:
                self._hand_off(f"w{i}")
            case Fault.COORDINATOR_RESTART:
                self._restarts.append(self._session.restart_later(step.hold_s))
            case Fault.CLOCK_STEP:
                step_clock(self._clocks[i], step.hold_s)
            case _:
                raise ValueError(f"not a fault of the lease store: {step.fault}")

    def _hand_off(self, worker: str) -> None:
        """An operator stops the job `worker` runs (the store's cancel: the job takes the next
        token) and submits the work again as a new job, which another claim takes."""
        try:
            job = self._session.one(_RUNNING, (self.job_class.name, worker))
            if job is None:
                log.info("handoff: %s runs no job", worker)
                return
            if self._store.cancel(job["id"], by="operator") is not None:
                self._submit(self._store, f"{job['idempotency_key']}:again", job["payload"])
        except StoreUnavailableError as exc:  # PostgreSQL restarting: no handoff this time
            log.info("handoff: %s", exc)

    def drain(self, timeout_s: float) -> bool:
        """Let every fault run its hold (a pause ends as scheduled, so a late one still makes
        its zombie), heal what is left, then wait until every job of the run has finished."""
        deadline = time.monotonic() + timeout_s
        time.sleep(max(0.0, self._healed - time.monotonic()))
        for timer in self._timers:
            timer.cancel()
        for proxy in self._proxies:
            proxy.restore()
        for thread in self._restarts:
            thread.join()
        for proc in self._procs:
            proc.resume()
            proc.start()
        self._feeder.join()
        while time.monotonic() < deadline:
            try:
                left = self._session.one(_UNFINISHED, (self.job_class.name,))
            except StoreUnavailableError:
                left = None
            if left is not None and left["n"] == 0:
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for proc in self._procs:
            proc.stop()
        for proxy in self._proxies:
            proxy.close()
        self._store.close()
