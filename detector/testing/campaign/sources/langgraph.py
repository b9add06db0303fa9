"""LangGraph on PostgreSQL: pods of a human-in-the-loop service resume interrupted threads
(`langgraph_worker`), each thread's resume handed out by a small scheduler's table with a claim
lease; a pod paused past its lease has its thread resumed by another pod from the same
checkpoint, and the two runs write two children of one checkpoint.

The ground truth is LangGraph's checkpoint table, read at each write (`langgraph_worker`); the
adapter's ledger, the scheduler's table and the recording destination share its database, as a
service would have them.

With `aimed`, each pause is aimed (`aim`): it lands inside a pod's work node and lasts until a
later claim's run wrote the same reply, so that each makes a zombie; the CI test's seed relies
on it. The campaign's own runs leave it off: there a pause lands wherever its pod is, as a real
stall does, and the published results keep their schedule.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

import psycopg

from detector.devstack.needs import missing_program
from detector.devstack.postgres import LocalPostgres, postgres_binaries
from detector.testing.campaign.aim import Aim
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.kills import WHY, Kills
from detector.testing.campaign.nemesis import Fault, Proc, Step, clock_env, step_clock
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.proxy import TcpProxy

RESUME_EVERY_S: Final = 0.45
THINK_S: Final = (1.0, 2.0)  # the work node's duration
DATABASE: Final = "campaign_langgraph"
WORKER: Final = "detector.testing.campaign.langgraph_worker"
READY_S: Final = 60.0

GRADE: Final = Grade("per_condition", destination_confirms=True)
BLIND: Final = {
    **WHY,
    "unwatched_run": "the thread ledger could not be reached when the run began (a partition, "
    "the database restarting): the adapter runs the block unwatched rather than fail the graph, "
    "so the run's events carry no epoch and its effects are not sent",
}


@dataclass
class LangGraphSource:
    name: str = "langgraph"
    faults: frozenset[Fault] = frozenset(
        {
            Fault.PAUSE_PAST_LEASE,
            Fault.CRASH_RESTART,
            Fault.GRACEFUL_SHUTDOWN,
            Fault.EXCEPTION_RETRY,
            Fault.PARTITION,
            Fault.COORDINATOR_RESTART,
            Fault.CLOCK_STEP,
        }
    )
    holds: Mapping[Fault, tuple[float, float]] = field(
        default_factory=lambda: {
            # past the claim's 2 s lease and the next pod's resume of the same checkpoint
            Fault.PAUSE_PAST_LEASE: (4.0, 7.0),
            Fault.CRASH_RESTART: (1.0, 3.0),
            Fault.GRACEFUL_SHUTDOWN: (1.0, 3.0),
            Fault.EXCEPTION_RETRY: (0.0, 0.0),
            Fault.PARTITION: (1.0, 6.0),
            Fault.COORDINATOR_RESTART: (0.5, 3.0),
            Fault.CLOCK_STEP: (0.5, 2.0),  # hours
        }
    )
    workers: int = 3
    threads: int = 24  # per run, one resume each
    span_s: float = 12.0
    steps: int = 4
    # The adapter's own events carry the ledger's seq; the user's effect calls carry none, so a
    # finding is ordered by seq when it lists one of the former (`per_condition`). Every commit
    # is PostgreSQL's: the forks' by the adapter, the node's effect by its transaction.
    grade: Grade = GRADE
    blind: Mapping[str, str] = field(default_factory=lambda: BLIND)
    aimed: bool = False  # every pause aimed (`aim`), for a test whose seed must make zombies

    def missing(self) -> str | None:
        for module in ("langgraph.checkpoint.postgres", "psycopg_pool"):
            if importlib.util.find_spec(module.split(".")[0]) is None:
                return f"{module} is not installed (pip install '.[langgraph]')"
        return missing_program("PostgreSQL", postgres_binaries)

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[Session]:
        with LocalPostgres() as server:
            dsn = server.create_database(DATABASE)
            setup(dsn)
            yield Session(server, dsn, self.threads, self.aimed)


def setup(dsn: str) -> None:
    """LangGraph's tables, the adapter's ledger and the campaign's own, in one database."""
    from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415

    from detector.adapters.langgraph import PostgresThreads  # noqa: PLC0415
    from detector.testing.campaign.langgraph_worker import SCHEMA  # noqa: PLC0415

    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
    ledger = PostgresThreads(dsn)
    try:
        ledger.setup()
    finally:
        ledger.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)


@dataclass
class Session:
    server: LocalPostgres
    dsn: str
    threads: int
    aimed: bool

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[Fleet]:
        fleet = Fleet(self, env)
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.stop()


class Fleet:
    """Three pods, each behind its own proxy to PostgreSQL, resuming the run's threads."""

    def __init__(self, session: Session, env: RunEnv) -> None:
        self.session = session
        self.env = env
        self.proxies: list[TcpProxy] = []
        self.procs: list[Proc] = []
        self.clocks = [env.workdir / f"clock-{i}" for i in range(3)]
        self.aims = [Aim(env.workdir / f"pod-{i}.aim") for i in range(3)]
        self._aiming = [threading.Lock() for _ in range(3)]  # one aim at a time per pod
        self.think = [round(env.rng.uniform(*THINK_S), 3) for _ in range(session.threads)]
        self._threads: list[threading.Thread] = []
        self._aimed: list[threading.Thread] = []  # the aimed pauses, among `_threads`
        self._timers: list[threading.Timer] = []
        self._restarting = threading.Lock()
        self.kills = Kills(env.campaign.outages)

    def start(self) -> None:
        """The pods, ready to claim, and the run's threads planned: the schedule's offsets count
        from the first resume."""
        port = self.session.server.port
        ready = []
        for i, control in enumerate(self.clocks):
            proxy = TcpProxy("127.0.0.1", port)
            self.proxies.append(proxy)
            dsn = psycopg.conninfo.make_conninfo(self.session.dsn, port=proxy.port)
            name = f"pod-{i}"
            ready.append(self.env.workdir / f"{name}.ready")
            aim = str(self.aims[i].path)
            argv = [sys.executable, "-m", WORKER, name, dsn, str(ready[-1]), aim]
            env = self.env.process_env(**clock_env(control))
            self.procs.append(Proc(name, argv, env, self.env.workdir / f"{name}.log").start())
        self._plan()
        deadline = time.monotonic() + READY_S
        while not all(path.exists() for path in ready):
            if time.monotonic() > deadline:
                raise RuntimeError(f"langgraph: the pods were not ready in {READY_S:g}s")
            time.sleep(0.1)
        self._release()

    def _spawn(self, target: object, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)
        return thread

    def _plan(self) -> None:
        """Each thread planned up to its interrupt (as the API that takes a request does), its
        resume queued for later: the schedule's clock starts once the pods are ready."""
        from langgraph.checkpoint.postgres import PostgresSaver  # noqa: PLC0415

        from detector.demos.langgraph_graph import build, thread  # noqa: PLC0415

        with (
            PostgresSaver.from_conn_string(self.session.dsn) as saver,
            psycopg.connect(self.session.dsn, autocommit=True) as conn,
        ):
            graph = build(saver)
            for n, think in enumerate(self.think):
                thread_id = f"run{self.env.run}-ticket-{n}"
                graph.invoke({"notes": []}, thread(thread_id, "api"))
                base = graph.get_state(thread(thread_id)).config["configurable"]
                conn.execute(
                    "INSERT INTO campaign_jobs (run, thread_id, base, think_s, slot)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (self.env.run, thread_id, base["checkpoint_id"], think, n),
                )

    def _release(self) -> None:
        """The resumes become claimable one every `RESUME_EVERY_S` from now, the first one for
        each pod at once."""
        with psycopg.connect(self.session.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE campaign_jobs SET not_before = now() + make_interval(secs =>"
                " greatest(slot - %s, 0) * %s) WHERE run = %s",
                (len(self.procs) - 1, RESUME_EVERY_S, self.env.run),
            )

    def apply(self, step: Step) -> None:
        proc = self.procs[step.target]
        match step.fault:
            case Fault.PARTITION:
                proxy = self.proxies[step.target]
                proxy.cut()
                self._later(step.hold_s, proxy.restore)
            case Fault.EXCEPTION_RETRY:
                proc.signal(signal.SIGUSR1)
            case Fault.COORDINATOR_RESTART:
                self._spawn(lambda: self._restart(step.hold_s), "campaign-postgres-restart")
            case Fault.CLOCK_STEP:
                step_clock(self.clocks[step.target], step.hold_s)
            case Fault.PAUSE_PAST_LEASE if self.session.aimed:
                aim = functools.partial(self._aimed_pause, step)
                self._aimed.append(self._spawn(aim, "campaign-aimed-pause"))
            case _:
                with self.kills.exiting(proc.name, step):  # the pod's name is its worker id
                    applied = proc.apply(step)
                if not applied:
                    raise ValueError(f"langgraph: no means for {step.fault}")

    def _aimed_pause(self, step: Step) -> None:
        """The pause, aimed (`aim`); the schedule does not wait for it, a second aim at the same
        pod waits for the first."""
        with self._aiming[step.target]:
            proc = self.procs[step.target]
            aim = self.aims[step.target]
            said = aim.pause(proc, self.env.truth, self.kills, step, self._idle)
            self.env.campaign.say(f"run {self.env.run}: aimed pause: {said}")

    def _later(self, seconds: float, action: object) -> None:
        timer = threading.Timer(seconds, action)  # type: ignore[arg-type]
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _restart(self, down_s: float) -> None:
        with self._restarting:
            server = self.session.server
            server.stop()
            time.sleep(down_s)
            server.start()

    def drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for thread in self._aimed:  # an aimed pause ends when its zombie is made, not here
            thread.join(max(0.0, deadline - time.monotonic()))
        for proxy in self.proxies:
            proxy.restore()
        for proc in self.procs:
            proc.resume()
        while time.monotonic() < deadline:
            if self._idle():
                return True
            time.sleep(0.5)
        return False

    def _idle(self) -> bool:
        """Every job of the run done or given up (unknown while the database is out of reach:
        not idle)."""
        with contextlib.suppress(psycopg.Error):
            return self._open() == 0
        return False

    def _open(self) -> int:
        with psycopg.connect(self.session.dsn, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT count(*) FROM campaign_jobs WHERE run = %s AND state IN "
                "('queued', 'running')",
                (self.env.run,),
            ).fetchone()
        return -1 if row is None else int(row[0])

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for thread in self._threads:
            thread.join(60)
        for proc in self.procs:
            proc.stop()
        for proxy in self.proxies:
            proxy.close()
        if self.session.server.pid() is None:
            self.session.server.start()
        from detector.testing.campaign.langgraph_worker import recover  # noqa: PLC0415

        recovered = recover(self.session.dsn, self.env.truth)
        if recovered:
            self.env.campaign.say(f"run {self.env.run}: {recovered} write(s) recovered")
        self.kills.mark(self.env.truth)


def source() -> LangGraphSource:
    return LangGraphSource()
