"""What the etcd, Kubernetes and redis-lock sources share: a fleet of leader-election worker
processes (`detector.testing.campaign.election`), each talking to the coordinator through a proxy
of its own (the partition) on a wall clock of its own (the clock step), beside a `splitbrain
watch` process that publishes the coordinator's holders where the coordinator tells them (etcd,
Kubernetes); the faults that fleet can suffer, with the writes its workers' exits may have
silenced (`kills`); and the coordinator's session."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Generic, Protocol, TypeVar

from detector.testing.campaign.election import READY
from detector.testing.campaign.kills import WHY, Kills
from detector.testing.campaign.nemesis import Fault, Proc, Step, clock_env, step_clock
from detector.testing.campaign.source import RunEnv
from detector.testing.campaign.truth import PROCESS_ENV, TruthLog
from detector.testing.proxy import TcpProxy

WORKERS: Final = 3
SHARDS: Final = 3
READY_S: Final = 60.0  # for the watcher, then the workers, to start

# Each worker's own wall clock steps; the rest the fleet causes with signals, the proxy or the
# server.
FAULTS: Final = frozenset(
    {
        Fault.PAUSE_PAST_LEASE,
        Fault.CRASH_RESTART,
        Fault.GRACEFUL_SHUTDOWN,
        Fault.PARTITION,
        Fault.HANDOFF,
        Fault.EXCEPTION_RETRY,
        Fault.COORDINATOR_RESTART,
        Fault.CLOCK_STEP,
    }
)


def holds(lease_s: float) -> Mapping[Fault, tuple[float, float]]:
    """Each fault's hold (`Source.holds`) when a silent leader's shard goes to another worker
    about `lease_s` after its last renewal: a pause outlasts that, a partition may or may not."""
    return MappingProxyType(
        {
            Fault.PAUSE_PAST_LEASE: (lease_s + 2.0, lease_s + 5.0),
            Fault.CRASH_RESTART: (1.0, 4.0),
            Fault.GRACEFUL_SHUTDOWN: (0.5, 2.0),
            Fault.PARTITION: (1.0, lease_s + 4.0),
            Fault.HANDOFF: (0.0, 0.0),
            Fault.EXCEPTION_RETRY: (0.0, 0.0),
            Fault.COORDINATOR_RESTART: (0.5, 2.0),  # plus the server's own start
            Fault.CLOCK_STEP: (-3.0, 3.0),  # hours
        }
    )


def blind(**own: str) -> Mapping[str, str]:
    """A source's blind spots (`Source.blind`): its own, and its workers' exits (`kills`)."""
    return MappingProxyType({**own, **WHY})


class ElectionSource:
    """The part of `Source` every election source shares: its fleet and its schedule's shape."""

    faults = FAULTS
    workers = WORKERS
    span_s = 8.0
    steps = 3


class Coordinator(Protocol):
    """The coordination system's server, as the devstack runs it (`LocalEtcd`,
    `LocalKubeApiServer`, `LocalRedis`): started and stopped again on the same data."""

    port: int

    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Coordinator)


def restarter(server: Coordinator) -> Callable[[float], None]:
    """`fleet`'s coordinator restart: `server` stopped, then started again on its data
    `down_s` later; two restarts in one run take turns."""
    turns = threading.Lock()

    def restart(down_s: float) -> None:
        with turns:
            server.stop()
            time.sleep(down_s)
            server.start()

    return restart


@dataclass
class ElectionSession(Generic[S]):
    """One campaign's coordinator; a source's `run` starts each run's fleet on it (`fleet`)."""

    server: S
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:6])  # the campaign's names

    def fleet(
        self,
        env: RunEnv,
        watcher_argv: Sequence[str],
        worker_argv: Callable[[int, int], Sequence[str]],
        done: Callable[[], bool],
        recover: Callable[[TruthLog], object] = lambda truth: None,
    ) -> contextlib.AbstractContextManager[ElectionFleet]:
        """`fleet` on this session's server."""
        return fleet(
            env,
            watcher_argv=watcher_argv,
            worker_argv=worker_argv,
            port=self.server.port,
            done=done,
            restart_coordinator=restarter(self.server),
            recover=recover,
        )


@dataclass
class ElectionFleet:
    """The workers of one run (`Fleet`): `done` says whether all of the run's work is done;
    `restart_coordinator(down_s)` stops the coordinator and starts it again on its data. The
    workers' exits are noted in `kills`, and marked in `truth` once they are all stopped."""

    workers: Sequence[Proc]
    proxies: Sequence[TcpProxy]
    clocks: Sequence[Path]
    done: Callable[[], bool]
    restart_coordinator: Callable[[float], None]
    kills: Kills
    truth: TruthLog
    # Records in `truth` the effects the coordinator made whose writers died before recording
    # them, once every worker is stopped.
    recover: Callable[[TruthLog], object] = lambda truth: None
    _timers: list[threading.Timer] = field(default_factory=list)
    _restarts: list[threading.Thread] = field(default_factory=list)
    _healed_by = 0.0  # time.monotonic() when the last fault applied ends by itself

    def apply(self, step: Step) -> None:
        self._healed_by = max(self._healed_by, time.monotonic() + step.hold_s)
        worker = self.workers[step.target]
        with self.kills.exiting(worker.name, step):
            applied = worker.apply(step)
        if applied:
            return
        match step.fault:
            case Fault.PARTITION:
                proxy = self.proxies[step.target]
                proxy.cut()
                self._later(step.hold_s, proxy.restore)
            case Fault.HANDOFF:
                worker.signal(signal.SIGUSR1)
            case Fault.EXCEPTION_RETRY:
                worker.signal(signal.SIGUSR2)
            case Fault.CLOCK_STEP:
                step_clock(self.clocks[step.target], step.hold_s)
            case Fault.COORDINATOR_RESTART:
                restart = threading.Thread(
                    target=self.restart_coordinator, args=(step.hold_s,), daemon=True
                )
                restart.start()
                self._restarts.append(restart)
            case _:
                raise ValueError(f"not a fault of this fleet: {step.fault}")

    def _later(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def drain(self, timeout_s: float) -> bool:
        """The faults run their course (a pause cut short is no pause past the lease), then
        whatever is left is healed and the work finishes."""
        deadline = time.monotonic() + timeout_s
        time.sleep(max(min(self._healed_by, deadline) - time.monotonic(), 0.0))
        self.heal()
        for restart in self._restarts:
            restart.join(max(deadline - time.monotonic(), 0.0))
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the coordinator may still be coming back
                if self.done():
                    return True
            time.sleep(0.5)
        return False

    def heal(self) -> None:
        """Every partition restored, every paused worker resumed, every stopped one started."""
        for timer in self._timers:
            timer.cancel()
        for proxy in self.proxies:
            proxy.restore()
        for worker in self.workers:
            worker.resume()
            worker.start()

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for worker in self.workers:
            worker.stop()
        for proxy in self.proxies:
            proxy.close()
        self.recover(self.truth)
        self.kills.mark(self.truth)


def python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def work_args(prefer: int, units: int) -> list[str]:
    return ["--shards", str(SHARDS), "--units", str(units), "--prefer", str(prefer)]


def worker(env: RunEnv, name: str, argv: Sequence[str], clock: Path) -> Proc:
    """A worker process on a wall clock of its own (`clock`), whose writes name it (`name`, as
    the nemesis's exits do) whatever executor ids its starts take."""
    return Proc(
        name,
        argv,
        env.process_env(**clock_env(clock), **{PROCESS_ENV: name}),
        env.workdir / f"{name}.log",
    )


@contextlib.contextmanager
def fleet(
    env: RunEnv,
    *,
    watcher_argv: Sequence[str] | None,
    worker_argv: Callable[[int, int], Sequence[str]],
    port: int,
    done: Callable[[], bool],
    restart_coordinator: Callable[[float], None],
    recover: Callable[[TruthLog], object] = lambda truth: None,
) -> Iterator[ElectionFleet]:
    """The run's watcher (ready once it follows; None where the workers' own adapter reports
    every holder) and `WORKERS` workers, worker `i` started as `worker_argv(i, proxy_port)`
    through a proxy to the coordinator's `port`; all stopped on leaving. The watcher resumes from
    its state file when it exits (one that gave up on Kafka), as a supervisor would start it."""
    state = ["--state-file", str(env.workdir / "watcher-state.json")]
    watcher = (
        None
        if watcher_argv is None
        else Proc(
            "watcher", [*watcher_argv, *state], env.process_env(), env.workdir / "watcher.log"
        )
    )
    proxies: list[TcpProxy] = []
    workers: list[Proc] = []
    clocks = [env.workdir / f"clock-w{i}" for i in range(WORKERS)]
    go = env.workdir / "go"
    try:
        if watcher is not None:
            watcher.start()
            _wait(lambda: "following" in _text(watcher.log), [watcher], "the watcher")
        for i in range(WORKERS):
            proxies.append(TcpProxy("127.0.0.1", port))
            argv = [*worker_argv(i, proxies[i].port), "--go", str(go)]
            workers.append(worker(env, f"w{i}", argv, clocks[i]).start())
        wait_ready(workers)
        go.touch()
        kills = Kills(env.campaign.outages)
        fleet = ElectionFleet(
            workers, proxies, clocks, done, restart_coordinator, kills, env.truth, recover
        )
        supervised = (
            contextlib.nullcontext()
            if watcher is None
            else env.campaign.supervised("watcher", watcher.alive, watcher.start)
        )
        with supervised:
            try:
                yield fleet
            finally:
                fleet.close()
            if watcher is not None:
                time.sleep(1.0)  # the watcher publishes the workers' last resignations
    finally:
        for proxy in proxies:
            proxy.close()
        if watcher is not None:
            watcher.stop()


def wait_ready(workers: Sequence[Proc]) -> None:
    """Until every worker has logged `READY` (one that exits, or a minute: an error naming the
    logs)."""
    _wait(lambda: all(READY in _text(w.log) for w in workers), workers, "the workers")


def _wait(ready: Callable[[], bool], procs: Sequence[Proc], what: str) -> None:
    deadline = time.monotonic() + READY_S
    while not ready():
        if not all(p.alive() for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start: see {', '.join(str(p.log) for p in procs)}")
        time.sleep(0.1)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
