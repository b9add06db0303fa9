"""The nemesis: a seeded schedule of a fleet's ordinary faults and of real zombies, and the
process-level means to cause them.

The schedule is a pure function of (seed, run): the same seed replays the same faults at the same
offsets on the same workers. Whether a fault made a zombie is not the schedule's to say: the
ground truth (`truth.py`) says whether a displaced owner acted.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Final, SupportsIndex


class Fault(StrEnum):
    # A stall past the lease (GC pause, swapped out, a hung call): SIGSTOP, then SIGCONT. The
    # one that makes real zombies when the worker was inside its work.
    PAUSE_PAST_LEASE = "pause_past_lease"
    CRASH_RESTART = "crash_restart"  # SIGKILL, started again: a dead worker cannot act
    PARTITION = "partition"  # the worker's connection to its coordinator drops for a while
    GRACEFUL_SHUTDOWN = "graceful_shutdown"  # SIGTERM, started again
    EXCEPTION_RETRY = "exception_retry"  # the work raises before its effect; the system retries
    HANDOFF = "handoff"  # the owner lets go cleanly and another takes over
    COORDINATOR_RESTART = "coordinator_restart"  # the coordination server restarts
    BROKER_RESTART = "broker_restart"  # Kafka restarts: events late, never lost
    CLOCK_STEP = "clock_step"  # one worker's wall clock jumps: verdicts must not move


# Faults the campaign itself causes; every other one is the source's fleet's to cause.
CAMPAIGN_FAULTS: Final = frozenset({Fault.BROKER_RESTART})


@dataclass(frozen=True, slots=True)
class Step:
    """One fault: at `at_s` seconds into the run, on worker `target`, held `hold_s` seconds
    (the pause, the partition, the time down; a clock step's size is `hold_s` hours)."""

    at_s: float
    fault: Fault
    target: int
    hold_s: float

    def describe(self) -> str:
        unit = "h" if self.fault is Fault.CLOCK_STEP else "s"  # a clock step is in hours
        return f"{self.at_s:5.1f}s {self.fault.value} worker {self.target} ({self.hold_s:g}{unit})"


def plan(
    seed: int,
    run: int,
    faults: Iterable[Fault],
    *,
    workers: int,
    span_s: float,
    steps: int,
    holds: Mapping[Fault, tuple[float, float]],
) -> tuple[Step, ...]:
    """The run's schedule: `steps` faults drawn from `faults`, at offsets within `span_s`, in
    time order. `holds` gives each fault's (min, max) hold in seconds; the source picks them
    (a pause past *its* lease)."""
    rng = random.Random(f"splitbrain-campaign:{seed}:{run}")
    menu = sorted(faults)
    drawn = [
        Step(
            at_s=round(rng.uniform(0.5, span_s), 2),
            fault=(fault := rng.choice(menu)),
            target=rng.randrange(workers),
            hold_s=_backward(fault, round(rng.uniform(*holds.get(fault, (1.0, 3.0))), 2)),
        )
        for _ in range(steps)
    ]
    return tuple(sorted(drawn, key=lambda s: (s.at_s, s.fault.value, s.target)))


def _backward(fault: Fault, hold_s: float) -> float:
    """A clock step goes backward only. Under libfaketime 0.9.10 a forward step freezes
    librdkafka's timed waits (their monotonic deadlines get the wall clock's offset): a producer's
    `poll(0.2)` never returned after a +30 min step, so the stepped worker sent nothing again (a
    langgraph miss, 2026-12-05). A real NTP step leaves those waits alone. Backward steps run
    clean for a producer made before them; one made after a backward step held its whole
    process, the GIL included, for 60 s in most tries on a loaded machine, so the campaign's
    workers make theirs at their start (`worker.sink`)."""
    return -abs(hold_s) if fault is Fault.CLOCK_STEP else hold_s


# ---- means ----------------------------------------------------------------------------------

_LIBFAKETIME: Final = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
)


def faketime_library() -> str | None:
    """Debian's libfaketime (package `faketime`), if installed."""
    return next((p for p in _LIBFAKETIME if os.path.exists(p)), None)


def clock_env(control: Path) -> dict[str, str]:
    """The environment that puts a process's wall clock under `control` (`step_clock`); its
    monotonic clock is left alone, as a stepped NTP clock leaves it. Empty without
    libfaketime."""
    library = faketime_library()
    if library is None:
        return {}
    control.write_text("+0\n")
    return {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": str(control),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def sleep_on_stepped_clock() -> None:
    """In a process started with `clock_env`: make `time.sleep` wait on a lock instead.
    libfaketime 0.9.10 fails Python's `time.sleep` with EINVAL when it leaves the monotonic clock
    alone (its absolute `clock_nanosleep` on that clock is converted with the wall clock's
    offset); a lock's timed wait is unaffected."""
    if "FAKETIME_TIMESTAMP_FILE" not in os.environ:
        return
    pause = threading.Event()

    def sleep(seconds: float | SupportsIndex) -> None:
        pause.wait(float(seconds))

    time.sleep = sleep


def step_clock(control: Path, hours: float) -> None:
    """Step the wall clock of every process started with `clock_env(control)`."""
    control.write_text(f"{hours * 3600:+.0f}\n")


@dataclass
class Proc:
    """One worker process of a fleet, restartable with the same command: the target of the
    process faults. Its own session, so a signal reaches its children too (a prefork pool)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _timers: list[threading.Timer] = field(default_factory=list, init=False)
    # Set by `stop`: no start or restart after it, even one scheduled before it whose timer
    # already fired, or one a fault still being applied schedules (such a process outlived its
    # campaign, parented by init).
    _stopped: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def start(self) -> Proc:
        with self._lock:
            if self._stopped or self.alive():
                return self
            with self.log.open("ab") as out:
                self.popen = subprocess.Popen(
                    list(self.argv),
                    env=dict(self.env),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals, *, group: bool = True) -> None:
        """`sig` to the process's group, or to the process alone (`group=False`)."""
        if self.popen is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                if group:
                    os.killpg(self.popen.pid, sig)
                else:
                    self.popen.send_signal(sig)

    def terminate(self) -> None:
        """Ask for a graceful shutdown: SIGTERM to the process alone, whose shutdown is its own
        to make (a prefork pool's child that gets SIGTERM dies inside its task, which Celery
        then counts as failed: no shutdown a user makes)."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM, group=False)

    def later(self, seconds: float, action: str) -> None:
        """`resume` or `start` this process `seconds` from now (the schedule does not wait)."""
        with self._lock:
            if self._stopped:
                return
            timer = threading.Timer(seconds, getattr(self, action))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def pause_for(self, seconds: float) -> None:
        self.signal(signal.SIGSTOP)
        self.later(seconds, "resume")

    def crash_for(self, seconds: float) -> None:
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(30)
        self.later(seconds, "start")

    def shut_down_for(self, seconds: float, grace_s: float = 20.0) -> None:
        self._shut_down(grace_s)
        self.later(seconds, "start")

    def _shut_down(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after `grace_s`."""
        self.terminate()
        if self.popen is not None:
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(30)

    def stop(self, grace_s: float = 20.0) -> None:
        """The end of the run: pending restarts cancelled, the process stopped (SIGTERM, then
        SIGKILL after `grace_s`)."""
        with self._lock:
            self._stopped = True
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
        self._shut_down(grace_s)

    def apply(self, step: Step) -> bool:
        """Cause a process fault; False if `step` is not one."""
        match step.fault:
            case Fault.PAUSE_PAST_LEASE:
                self.pause_for(step.hold_s)
            case Fault.CRASH_RESTART:
                self.crash_for(step.hold_s)
            case Fault.GRACEFUL_SHUTDOWN:
                self.shut_down_for(step.hold_s)
            case _:
                return False
        return True
