"""The nemesis's process faults: a graceful shutdown is asked of the worker's main process alone,
as a user asks it; a crash takes its whole process group."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from detector.testing.campaign.nemesis import Fault, Proc, plan


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_graceful_shutdown_signals_the_main_process_not_its_pool(tmp_path: Path) -> None:
    """A Celery prefork child that gets SIGTERM dies inside its task (WorkerLostError) and the
    task is acknowledged as failed: the campaign lost a unit of work to its own shutdown."""
    child_pid = tmp_path / "child"
    script = f"sleep 30 & echo $! > {child_pid}; trap 'exit 0' TERM; wait"
    proc = Proc("leader", ["sh", "-c", script], dict(os.environ), tmp_path / "log").start()
    _wait_for(lambda: child_pid.exists() and child_pid.read_text().strip(), "the child's pid")
    child = int(child_pid.read_text())
    try:
        proc.shut_down_for(3600)
        assert not proc.alive()
        assert _alive(child)  # left to its parent's shutdown, not signalled with it
    finally:
        proc.stop()
        os.kill(child, signal.SIGKILL)


def test_a_crash_kills_the_whole_process_group(tmp_path: Path) -> None:
    child_pid = tmp_path / "child"
    script = f"sleep 30 & echo $! > {child_pid}; wait"
    proc = Proc("leader", ["sh", "-c", script], dict(os.environ), tmp_path / "log").start()
    _wait_for(lambda: child_pid.exists() and child_pid.read_text().strip(), "the child's pid")
    child = int(child_pid.read_text())
    proc.crash_for(3600)
    try:
        _wait_for(lambda: not _alive(child), "the child to die with its group")
    finally:
        proc.stop()


def test_a_stopped_process_is_never_started_again(tmp_path: Path) -> None:
    """A restart a crash scheduled, or one a fault still being applied schedules as the run
    stops, must not start a worker after the run: it would outlive the campaign (parented by
    init, still holding its stepped clock and its leases)."""
    proc = Proc("w0", ["sleep", "30"], dict(os.environ), tmp_path / "log").start()
    proc.crash_for(0.2)  # its restart is due in 0.2 s
    proc.stop(grace_s=1)
    proc.later(0.0, "start")  # a fault still being applied, after the stop
    proc.start()
    time.sleep(0.5)  # past both restarts' times: nothing may come
    assert not proc.alive()


def test_a_clock_step_only_goes_backward() -> None:
    """libfaketime 0.9.10 freezes librdkafka's timed waits on a forward step: the campaign would
    measure its own tool, not the product."""
    holds = {Fault.CLOCK_STEP: (-3.0, 3.0)}
    steps = [
        s
        for run in range(40)
        for s in plan(1, run, [Fault.CLOCK_STEP], workers=3, span_s=10.0, steps=3, holds=holds)
    ]
    assert steps and all(s.hold_s <= 0 for s in steps)
