"""Processes of the dev stack, done one way for every server starter: a free port, a child
started into its log and waited for, a PID told apart from a recycled one by its start time,
signals by PID, a stop that ends in SIGKILL to the process group, and the tail of a log for an
error message. psutil reads /proc."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil
from typing_extensions import TypeIs

from detector.closing import Started
from detector.devstack.errors import StackError

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
_TICKS: Final = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- identity


def _started(proc: psutil.Process) -> str:
    """When `proc` started, in clock ticks after boot as /proc/PID/stat has it (the unit records
    have always kept): psutil's create_time adds the boot time, which a wall-clock step moves."""
    return str(round((proc.create_time() - psutil.boot_time()) * _TICKS))


@dataclass(frozen=True, slots=True)
class Pid:
    """A process, told apart from a later one with the same number by its start time."""

    pid: int
    start: str | None  # clock ticks after boot: with the PID, names one process for good

    @classmethod
    def of(cls, pid: int) -> Pid:
        try:
            return cls(pid, _started(psutil.Process(pid)))
        except psutil.Error:
            return cls(pid, None)

    def process(self) -> psutil.Process | None:
        """The recorded process, a zombie included; None once it is gone or its number names
        a later one."""
        try:
            proc = psutil.Process(self.pid)
            if self.start is None or _started(proc) == self.start:
                return proc
        except psutil.Error:
            pass
        return None

    def alive(self) -> bool:
        """Running (a zombie is not): the same process that was recorded."""
        return runs(self.process())

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Pid:
        return cls(int(doc["pid"]), doc.get("start"))


def runs(proc: psutil.Process | None) -> TypeIs[psutil.Process]:
    """`proc` is there and not a zombie."""
    try:
        return proc is not None and proc.status() not in _GONE
    except psutil.Error:
        return False


def runs_with(pid: int, *arguments: str) -> bool:
    """`pid` runs (a zombie does not) with each of `arguments` as a word of its command line:
    how a server known by a pid file alone is told from a later process given its number."""
    try:
        proc = psutil.Process(pid)
        return runs(proc) and set(arguments) <= set(proc.cmdline())
    except psutil.Error:
        return False


def pids_with_argument(argument: str) -> list[Pid]:
    """The running processes whose command line has `argument` as one of its words."""
    found = [
        Pid.of(proc.pid)
        for proc in psutil.process_iter(["cmdline"])
        if argument in (proc.info["cmdline"] or ())
    ]
    return [p for p in found if p.alive()]


# ---------------------------------------------------------------------------------- signals


def send(pid: Pid, sig: int, *, group: bool = False) -> None:
    """`sig` to `pid` if it is still that process (to its process group with `group`: each
    server leads a session, hence a group, of its own)."""
    proc = pid.process()
    if not runs(proc):
        return
    with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
        if group:  # psutil signals one process; a group is the kernel's
            os.killpg(pid.pid, sig)
        else:
            proc.send_signal(sig)  # psutil checks once more that the number is still its own


def _wait_gone(pids: Sequence[Pid], timeout: float, reap: Callable[[], None]) -> bool:
    """Polled rather than psutil.wait_procs: that reaps our own children behind their
    subprocess.Popen (whose exit code then reads 0), and waits on another process's zombie
    until its parent reaps it, where a zombie has stopped for the stack."""
    deadline = time.monotonic() + timeout
    while True:
        reap()
        if not any(p.alive() for p in pids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def stop_pids(
    pids: Sequence[Pid],
    *,
    sig: int = signal.SIGTERM,
    timeout: float = 15.0,
    reap: Callable[[], None] = lambda: None,
) -> None:
    """`sig` (after SIGCONT: a paused process cannot act on it), then SIGKILL to the process
    group of whatever is still there after `timeout`."""
    for p in pids:
        send(p, signal.SIGCONT)
        send(p, sig)
    if _wait_gone(pids, timeout, reap):
        return
    for p in pids:
        send(p, signal.SIGKILL, group=True)
        send(p, signal.SIGKILL)
    if not _wait_gone(pids, 10.0, reap):
        left = ", ".join(str(p.pid) for p in pids if p.alive())
        raise StackError(f"process(es) {left} survived SIGKILL")


def spawn(argv: Sequence[str], log_path: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """A server as this process's child, in its own session (no terminal signals, killable
    alone), its output appended to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )


def came_up(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float, interval: float
) -> bool:
    """Wait until `ready()`, asking every `interval` s; False as soon as `proc` exits, or once
    `timeout` s have passed."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


class ChildServer(Started):
    """A server this process runs as its child on a free loopback port (`port`), in a throwaway
    directory (`root`: its data and log). `stop` ends it by PID; `close` also removes the
    directory. A subclass finds its binary before `__init__`, so that a missing one leaves no
    directory behind."""

    def __init__(self, prefix: str, start_timeout: float) -> None:
        self.start_timeout = start_timeout
        self.port = free_port()
        self._root = Path(tempfile.mkdtemp(prefix=prefix))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> Path:
        """The throwaway directory (data, log) that `close` removes."""
        return self._root

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, then SIGKILL if it is still there after `timeout`."""
        proc, self._proc = self._proc, None
        stop_child(proc, timeout)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)


def stop_child(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Stop a server this process started: SIGTERM, then SIGKILL if it is still there after
    `timeout`; reaped either way (nothing is done for one that has exited)."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10.0)


# ------------------------------------------------------------------------------------ ports

_handed_out: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 *below* the kernel's ephemeral range, never one this process
    handed out before.

    Why not port 0: that hands out an ephemeral port, which the kernel may later give to some
    client's outgoing connection while the broker is down (between kill and restart), and then
    the broker cannot bind its own port again. It also invites TCP self-connects on loopback.
    Why remember: a port is free when it is handed out, not when its server binds it; a test
    that takes a worker's metrics port, then Prometheus's, before starting the worker could
    otherwise be given the same port twice, and the second server to bind it fails.
    """
    low = _ephemeral_port_low()
    floor = 10000
    if low - floor >= 1000:
        for _ in range(100):
            port = floor + secrets.randbelow(low - floor)
            if port in _handed_out or not port_free(port):
                continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        fallback: int = sock.getsockname()[1]
        _handed_out.add(fallback)
        return fallback


def _ephemeral_port_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int) -> bool:
    """Nothing is bound to `port` on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_open(port: int) -> bool:
    """Something listens on `port` on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        if sock.connect_ex(("127.0.0.1", port)) != 0:
            return False
        # A loopback connect can pick the target port as its own source port and
        # "succeed" by connecting to itself while nothing listens.
        return bool(sock.getsockname()[1] != port)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """`url` answers with a 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return 200 <= int(answer.status) < 300
    except (OSError, ValueError):
        return False


# -------------------------------------------------------------------------------------- logs


def last_lines(path: Path, lines: int, missing: str) -> str:
    """The last `lines` lines of a server's own log, for its starter's errors; `missing` when
    there is no log to read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return missing


def log_tail(path: Path | None, lines: int = 8) -> str:
    """The last lines of a server's log, indented under the line that names it."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join(f"    {line}" for line in text)
