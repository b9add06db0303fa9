"""The dev stack's one process helper, on real processes of this machine: a recorded PID is the
process it was (never a zombie, never a later process with the same number), a stop ends with
SIGKILL, and a process is found by a word of its command line whatever its name holds."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from detector.devstack import process
from detector.devstack.process import Pid


def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        time.sleep(0.01)


@contextmanager
def child(*argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session of its own that says `ready` once it runs its code."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


def test_a_recorded_process_is_alive_until_it_exits_and_a_zombie_is_not() -> None:
    with child(sys.executable, "-c", SLEEPER) as proc:
        pid = Pid.of(proc.pid)
        assert pid.alive()
        os.kill(proc.pid, signal.SIGKILL)
        until(lambda: not pid.alive())  # not reaped yet: a zombie
        zombie = pid.process()
        assert zombie is not None and zombie.status() == psutil.STATUS_ZOMBIE


def test_a_later_process_with_the_same_number_is_not_the_recorded_one() -> None:
    me = Pid.of(os.getpid())
    assert me.alive()
    assert not Pid(os.getpid(), start=str(int(me.start or 0) + 1)).alive()
    assert Pid.from_json(me.to_json()) == me


def test_a_process_named_with_spaces_and_parentheses_is_recorded(tmp_path: Path) -> None:
    python = tmp_path / "a) (b c"
    shutil.copy(sys.executable, python)
    with child(str(python), "-c", SLEEPER) as proc:
        pid = Pid.of(proc.pid)
        assert pid.start is not None and pid.alive()
        assert process.runs_with(proc.pid, str(python), SLEEPER)
        assert not process.runs_with(proc.pid, "elsewhere")


def test_a_process_is_found_by_a_word_of_its_command_line() -> None:
    word = f"splitbrain-test-{uuid.uuid4().hex}"
    with child(sys.executable, "-c", SLEEPER, word) as proc:
        assert process.pids_with_argument(word) == [Pid.of(proc.pid)]
    assert process.pids_with_argument(word) == []


def test_a_process_that_ignores_its_stop_signal_is_killed() -> None:
    with child(sys.executable, "-c", IGNORES_SIGTERM) as proc:

        def reap() -> None:
            proc.poll()

        process.stop_pids([Pid.of(proc.pid)], timeout=0.5, reap=reap)
        # Gone once a zombie: `reap` may have polled just before it died, so reap it here.
        assert proc.wait(timeout=10) == -signal.SIGKILL


def test_a_server_this_process_started_is_stopped_and_reaped() -> None:
    with child(sys.executable, "-c", SLEEPER) as proc:
        process.stop_child(proc)
        assert proc.returncode == -signal.SIGTERM


def test_a_free_port_is_handed_out_once_and_opens_when_a_server_listens() -> None:
    ports = [process.free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    port = ports[0]
    assert process.port_free(port) and not process.port_open(port)
    with socket.create_server(("127.0.0.1", port)):
        assert process.port_open(port) and not process.port_free(port)
