"""The whole product on one machine, on loopback: the stack of `splitbrain demo`, of
`splitbrain dev up|down|status` and of the demo's test.

Components, in the order they start (and the reverse of the order they stop):

- `kafka`: the broker (`LocalKafka`, its jars from Maven Central; Java 17+), then the topics of
  the bundled `topics/topics.yaml` (`topics apply --profile local`: the product's own topic names);
- `postgres`: PostgreSQL (`LocalPostgres`, Debian's `postgresql`) with the lease store migrated
  in database `jobs`;
- `destination`: the example destination over HTTP (`python -m detector.leases.http_destination`,
  unfenced unless `Options.fenced`);
- `relay`: the outbox relay (`splitbrain leases relay`) to `agent.ownership.v1`;
- `detector-N`: `splitbrain worker` processes in one group, each with /metrics (`WorkerProcess`);
- `alertmanager`: Alertmanager (Debian's `prometheus-alertmanager`), holding what it is sent;
- `prometheus`: Prometheus (Debian's `prometheus`) with the bundled `alerts/splitbrain.rules.yml`
  (copied into its directory), scraping the detectors and evaluating every second, sending to
  Alertmanager;
- `view`: the findings view (`splitbrain ui`, the `ui` extra), on loopback (`Options.view`).
- `pager`: the pager bridge (`splitbrain page --alertmanager-url`, `--finding-url` to the view).

Each runs as a process of its own session (a terminal's Ctrl-C reaches only the command that
started them, which stops them), with its log in `STATE_DIR/logs/`. Each is recorded, as soon
as it is spawned, in `STATE_DIR/stack.json` (its PIDs with their start times, so that a recycled
PID is never signalled, its URLs and its data), so that what one command started another can
stop (`splitbrain dev down`), and is stopped by PID: SIGTERM (SIGINT for PostgreSQL's fast
shutdown), then SIGKILL to its process group. A component whose Debian package is missing is
skipped with one line that says what to install; Java (and Maven, until the jars are cached)
is required. `locked` keeps two commands off one state directory.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final, Literal

import yaml

from detector import bundled
from detector.contracts.topics import DLQ_TOPIC, FINDINGS_TOPIC, GROUP_ID, INPUT_TOPIC
from detector.devstack.kafka import JARS_MARKER, DevKafkaError, LocalKafka, free_port, jars_dir
from detector.devstack.kafka_cluster import LocalKafkaCluster, open_kafka
from detector.devstack.topics import WorkerTopics
from detector.devstack.worker import WorkerProcess, connection_env
from detector.errors import SplitbrainError

STATE_FILE: Final = "stack.json"
LOCK_FILE: Final = "lock"
SCHEMA: Final = "splitbrain.dev-stack/v1"
DATABASE: Final = "jobs"
DESTINATION_NAME: Final = "example-pay"
SCRAPE_JOB: Final = "splitbrain"  # the job the alerting rules expect
# What a fresh start removes from the state directory, and nothing else: the directory may be
# one a user named.
_OWNED: Final = ("kafka", "detectors", "prometheus", "alertmanager", "logs", STATE_FILE)
_JAVA_MAJOR: Final = 17

Say = Callable[[str], None]


class StackError(SplitbrainError, RuntimeError):
    """A component did not start or stop; the message says which, why and where its log is."""


class UnusableError(StackError):
    """The machine or the flags cannot run the stack (no Java, a busy port, a state directory
    in use): found before anything was started."""


# ------------------------------------------------------------------------------ interrupts


class Interrupts:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP as `KeyboardInterrupt` in the main thread, once
    `install`ed: deferred while a process is spawned and recorded (so none is ever started
    without its PID on record), and ignored while the stack stops."""

    SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self._stopping = 0
        self.received: int | None = None

    def install(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self._stopping:
            return
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending and not self._stopping:
                self._pending = False
                raise KeyboardInterrupt

    @contextlib.contextmanager
    def ignored(self) -> Iterator[None]:
        self._stopping += 1
        try:
            yield
        finally:
            self._stopping -= 1


interrupts = Interrupts()


# ----------------------------------------------------------------------------------- PIDs


@dataclass(frozen=True, slots=True)
class Pid:
    """A process, told apart from a later one with the same number by its start time."""

    pid: int
    start: str | None

    @classmethod
    def of(cls, pid: int) -> Pid:
        return cls(pid, _start_time(pid))

    def alive(self) -> bool:
        """Running (a zombie is not): the same process that was recorded."""
        try:
            stat = (Path("/proc") / str(self.pid) / "stat").read_text()
        except OSError:
            return False
        fields = stat.rpartition(")")[2].split()
        if not fields or fields[0] in ("Z", "X"):
            return False
        return self.start is None or (len(fields) > 19 and fields[19] == self.start)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Pid:
        return cls(int(doc["pid"]), doc.get("start"))


def _start_time(pid: int) -> str | None:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _signal(pid: Pid, sig: int, *, group: bool = False) -> None:
    if not pid.alive():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid.pid, sig)  # each component leads a session, hence a group, of its own
        else:
            os.kill(pid.pid, sig)


def _wait_gone(pids: Sequence[Pid], timeout: float, reap: Callable[[], None]) -> bool:
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
        _signal(p, signal.SIGCONT)
        _signal(p, sig)
    if _wait_gone(pids, timeout, reap):
        return
    for p in pids:
        _signal(p, signal.SIGKILL, group=True)
        _signal(p, signal.SIGKILL)
    if not _wait_gone(pids, 10.0, reap):
        left = ", ".join(str(p.pid) for p in pids if p.alive())
        raise StackError(f"process(es) {left} survived SIGKILL")


def _pids_with_argument(argument: str) -> list[Pid]:
    """The processes whose command line has `argument` as one of its words."""
    needle = argument.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in words:
            found.append(Pid.of(int(entry.name)))
    return [p for p in found if p.alive()]


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return 200 <= int(answer.status) < 300
    except (OSError, ValueError):
        return False


def log_tail(path: Path | None, lines: int = 8) -> str:
    """The last lines of a component's log, indented under the line that names it."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join(f"    {line}" for line in text)


# ------------------------------------------------------------------------------ components


Kind = Literal["kafka", "postgres", "process"]


@dataclass
class Component:
    """One server of the stack: started by `start` (which records its PIDs as soon as they
    exist), waited for by `wait_ready`, stopped by `stop`. `record` is its entry in
    `stack.json`, from which `stop_record` stops it from another process too."""

    name: str
    kind: Kind = "process"
    urls: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    data: dict[str, Any] = field(default_factory=dict)
    pids: list[Pid] = field(default_factory=list)
    stopped: bool = False

    def start(self, stack: Stack) -> None:
        raise NotImplementedError

    def wait_ready(self, deadline: float) -> None:
        """Until the component serves; a `StackError` (with its log's tail) if it died or did
        not get there before `deadline` (time.monotonic())."""

    def running(self) -> bool:
        return bool(self.pids) and all(p.alive() for p in self.pids)

    def stop(self) -> None:
        if not self.stopped:
            stop_record(self.record(), reap=self._reap)
            self.stopped = True

    def _reap(self) -> None:
        """Collect our own exited children, so that they do not linger as zombies."""

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "pids": [p.to_json() for p in self.pids],
            "urls": self.urls,
            "log": None if self.log is None else str(self.log),
            "data": self.data,
        }

    def _failed(self, what: str) -> StackError:
        tail = log_tail(self.log)
        where = f" (log: {self.log})" if self.log is not None else ""
        return StackError(f"{self.name} {what}{where}" + (f"\n{tail}" if tail else ""))


@dataclass
class Process(Component):
    """A program of the stack, in a session of its own, its output in its log. `ready` says
    when it serves (by default: as soon as it runs)."""

    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    ready: Callable[[], bool] | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 15.0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, stack: Stack) -> None:
        assert self.log is not None
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with interrupts.deferred(), self.log.open("ab") as out:
            self.proc = self._spawn(out)
            self.pids = [Pid.of(self.proc.pid)]
            stack.save()

    def _spawn(self, out: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )

    def wait_ready(self, deadline: float) -> None:
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise self._failed(f"exited with code {self.proc.returncode} while starting")
            if self.ready is None or self.ready():
                return
            if time.monotonic() > deadline:
                raise self._failed("did not get ready in time")
            time.sleep(0.1)

    def running(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        return super().running()

    def signal_stop(self) -> None:
        """Ask it to stop (SIGCONT, then its stop signal) without waiting: `Stack.stop` asks
        every process at once, then waits for each."""
        for p in self.pids:
            _signal(p, signal.SIGCONT)
            _signal(p, self.stop_signal)

    def record(self) -> dict[str, Any]:
        doc = super().record()
        doc["stop_signal"] = signal.Signals(self.stop_signal).name
        doc["stop_timeout"] = self.stop_timeout
        return doc

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.poll()


@dataclass
class Detector(Process):
    """A `splitbrain worker`, started by `WorkerProcess` (argv, environment, /metrics)."""

    worker: WorkerProcess | None = field(default=None, repr=False)

    def _spawn(self, out: IO[bytes]) -> subprocess.Popen[bytes]:
        assert self.worker is not None
        self.worker.start()
        assert self.worker.proc is not None
        return self.worker.proc


@dataclass
class Kafka(Component):
    broker: LocalKafka | LocalKafkaCluster | None = field(default=None, repr=False)

    def start(self, stack: Stack) -> None:
        data_dir = stack.dir / "kafka"
        self.data["data_dir"] = str(data_dir)
        timeout = max(5.0, stack.left())
        if stack.options.brokers > 1:
            self.broker = LocalKafkaCluster(
                data_dir, brokers=stack.options.brokers, start_timeout=timeout
            )
            self.log = data_dir / "broker-1" / "logs" / "server.log"
        else:
            self.broker = LocalKafka(data_dir, start_timeout=timeout)
            self.log = data_dir / "logs" / "server.log"
        stack.save()  # the data directory holds the broker's pid file from its first moment
        try:
            self.broker.start()
        except DevKafkaError as exc:
            raise StackError(str(exc).splitlines()[0] + f" (log: {self.log})") from exc
        if isinstance(self.broker, LocalKafkaCluster):
            pids = [pid for pid in self.broker.pids().values() if pid is not None]
        else:
            pid = self.broker.pid()
            pids = [] if pid is None else [pid]
        self.pids = [Pid.of(pid) for pid in pids]
        self.urls["bootstrap.servers"] = self.broker.bootstrap

    def stop(self) -> None:
        if self.stopped:
            return
        if self.broker is not None:  # ours: its stop also reaps the JVM
            try:
                self.broker.stop()
            except DevKafkaError as exc:
                raise StackError(f"kafka: {exc}") from exc
        super().stop()

    def client_config(self) -> dict[str, Any]:
        assert self.broker is not None
        return dict(self.broker.client_config())


@dataclass
class Postgres(Component):
    """PostgreSQL from Debian's package (`LocalPostgres`: as root, run as an unprivileged
    user), with the lease store migrated in database `jobs`."""

    def start(self, stack: Stack) -> None:
        from detector.devstack.postgres import LocalPostgres, LocalPostgresError  # noqa: PLC0415
        from detector.leases.db import connect  # noqa: PLC0415
        from detector.leases.schema import migrate  # noqa: PLC0415

        server = LocalPostgres(start_timeout=max(5.0, stack.left()))
        self.data.update(root=str(server.data_dir.parent), data_dir=str(server.data_dir))
        self.log = server.log_path
        stack.save()
        try:
            server.start()
        except LocalPostgresError as exc:
            raise StackError(f"postgres did not start: {str(exc).splitlines()[0]}") from exc
        pid = server.pid()
        self.pids = [] if pid is None else [Pid.of(pid)]
        dsn = server.create_database(DATABASE)
        with connect(dsn) as conn:
            migrate(conn)
        self.urls["dsn"] = dsn


@dataclass(frozen=True, slots=True)
class Skipped:
    """A component that cannot run here, and the one line that says why and what to do."""

    name: str
    reason: str


def stop_record(
    record: Mapping[str, Any],
    *,
    timeout: float | None = None,
    reap: Callable[[], None] = lambda: None,
) -> None:
    """Stop one component of `stack.json` by its recorded PIDs (a broker or a database also by
    its data directory), then remove its recorded `root` directory; nothing happens for what
    is gone already."""
    kind = record.get("kind", "process")
    data = record.get("data") or {}
    pids = _leftovers(record)
    if kind == "kafka":
        if data.get("data_dir"):
            try:
                open_kafka(Path(data["data_dir"])).stop(timeout=timeout or 30.0)
            except DevKafkaError as exc:
                raise StackError(f"kafka: {exc}") from exc
        stop_pids(pids, timeout=timeout or 30.0, reap=reap)
    elif kind == "postgres":
        # SIGINT is PostgreSQL's fast shutdown: clients are disconnected, not waited for.
        stop_pids(pids, sig=signal.SIGINT, timeout=timeout or 30.0, reap=reap)
    else:
        sig = signal.Signals[record.get("stop_signal", "SIGTERM")]
        wait = timeout or float(record.get("stop_timeout", 15))
        stop_pids(pids, sig=sig, timeout=wait, reap=reap)
    if data.get("root"):  # a server's throwaway directory (PostgreSQL's, etcd's)
        shutil.rmtree(data["root"], ignore_errors=True)


# ---------------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class Options:
    """What can be chosen about the stack; a port of 0 is a free one."""

    prometheus_port: int = 0
    alertmanager_port: int = 0
    destination_port: int = 0
    detectors: int = 2
    fenced: bool = False  # the example destination enforces the fence (False: the demo's mode)
    brokers: int = 1  # 3 or more: a KRaft cluster, and the topics' default (production) profile
    pager: bool = True
    view: bool = False  # the findings view (`splitbrain ui`), where the pager's pages link


PORT_FLAGS: Final = {
    "prometheus_port": "--prometheus-port",
    "alertmanager_port": "--alertmanager-port",
    "destination_port": "--destination-port",
}


@dataclass(frozen=True, slots=True)
class Tools:
    """The external programs found by `preflight`; None where one is missing."""

    prometheus: str | None
    alertmanager: str | None
    postgres: bool
    pager: bool
    view: bool
    skipped: tuple[Skipped, ...]


def java_major(java: str) -> int | None:
    """The major version `java -version` reports (8 for 1.8), or None if it does not run."""
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


def preflight(options: Options, say: Say) -> Tools:
    """Check what the stack needs before anything starts: Java 17+, Kafka's jars (resolved from
    Maven Central once, then cached), the ports asked for; an `UnusableError` says what to do.
    Find the optional programs; each one missing is a `Skipped` line."""
    java = _java()
    if java is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if os.environ.get("JAVA_HOME")
            else "no java on PATH and JAVA_HOME is unset"
        )
        raise UnusableError(
            f"the Kafka broker needs Java {_JAVA_MAJOR}+ ({where}): install it "
            "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    major = java_major(java)
    if major is None or major < _JAVA_MAJOR:
        raise UnusableError(
            f"the Kafka broker needs Java {_JAVA_MAJOR}+, and {java} is "
            f"{'not runnable' if major is None else f'Java {major}'}: install "
            "openjdk-17-jre-headless or point JAVA_HOME at a JDK 17+"
        )
    for name, flag in PORT_FLAGS.items():
        port = getattr(options, name)
        if port and not port_free(port):
            raise UnusableError(
                f"port {port} on 127.0.0.1 ({flag}) is in use: stop what listens there, or pass "
                f"another port ({flag} 0 picks a free one)"
            )
    if not (jars_dir() / JARS_MARKER).exists():
        if shutil.which("mvn") is None:
            raise UnusableError(
                "Kafka's jars are not cached yet and Maven (mvn) is not on PATH: install it "
                "(apt-get install maven), it fetches them from Maven Central once"
            )
        say(f"resolving Kafka's jars from Maven Central into {jars_dir()} (once)")
    from detector.devstack.kafka import ensure_jars  # noqa: PLC0415

    try:
        ensure_jars()
    except DevKafkaError as exc:
        raise UnusableError(
            f"Kafka's jars could not be resolved from Maven Central: {str(exc).splitlines()[0]}"
            " (check the network and Maven's settings)"
        ) from exc
    skipped: list[Skipped] = []
    root = os.geteuid() == 0
    install = "apt-get install" if root else "as root: apt-get install"
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        skipped.append(
            Skipped(
                "prometheus",
                f"not installed ({install} prometheus): the alerting rules are not evaluated",
            )
        )
    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if alertmanager is None:
        skipped.append(
            Skipped(
                "alertmanager",
                f"not installed ({install} prometheus-alertmanager): nothing can be paged",
            )
        )
    postgres = True
    try:
        from detector.devstack.postgres import postgres_binaries  # noqa: PLC0415

        postgres_binaries()
    except (ImportError, SplitbrainError):
        postgres = False
        skipped.append(
            Skipped(
                "postgres",
                f"not installed ({install} postgresql): no lease store, so no destination, "
                "relay or agents",
            )
        )
    pager = options.pager
    if pager and alertmanager is None:
        pager = False
        skipped.append(Skipped("pager", "it pages through Alertmanager, which is missing"))
    view = options.view and all(
        importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn")
    )
    if options.view and not view:
        skipped.append(
            Skipped("view", "the ui extra is not installed (pip install '.[ui]'): no findings view")
        )
    return Tools(prometheus, alertmanager, postgres, pager, view, tuple(skipped))


# ------------------------------------------------------------------------------------ stack


@contextlib.contextmanager
def locked(state_dir: Path, command: str) -> Iterator[None]:
    """Hold `STATE_DIR/lock` (an advisory lock the kernel drops when the process ends); an
    `UnusableError` naming the holder when another command holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UnusableError(
            f"{state_dir} is in use by {holder}: wait for it to finish (or stop it), or give "
            "this run another --state-dir"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"`{command}` (pid {os.getpid()})\n")
        handle.flush()
        yield
    finally:
        handle.close()


def load_record(state_dir: Path) -> dict[str, Any] | None:
    """`stack.json` of `state_dir`, or None when there is none (or it cannot be read)."""
    try:
        doc = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def record_alive(record: Mapping[str, Any]) -> dict[str, bool]:
    """By component name: whether every recorded process of it runs."""
    out = {}
    for comp in record.get("components", []):
        pids = [Pid.from_json(p) for p in comp.get("pids") or []]
        out[comp["name"]] = bool(pids) and all(p.alive() for p in pids)
    return out


def stop_recorded(state_dir: Path, say: Say) -> int:
    """Stop, in reverse order, every component `stack.json` records that still runs; how many
    were running. The record is kept, marked stopped."""
    record = load_record(state_dir)
    if record is None:
        return 0
    stopped = 0
    errors = []
    running = [c for c in reversed(record.get("components", [])) if _leftovers(c)]
    for comp in running:  # every process is asked at once, then each is waited for
        if comp.get("kind", "process") == "process":
            sig = signal.Signals[comp.get("stop_signal", "SIGTERM")]
            for pid in _leftovers(comp):
                _signal(pid, signal.SIGCONT)
                _signal(pid, sig)
    for comp in running:
        try:
            stop_record(comp)
        except StackError as exc:
            errors.append(str(exc))
            continue
        stopped += 1
        say(f"stopped {comp['name']}")
    for comp in record.get("components", []):  # a server that died still has its files
        root = (comp.get("data") or {}).get("root")
        if root and not _leftovers(comp):
            shutil.rmtree(root, ignore_errors=True)
    record["running"] = False
    record["stopped_at"] = _now()
    _write_json(state_dir / STATE_FILE, record)
    if errors:
        raise StackError("; ".join(errors))
    return stopped


def _leftovers(record: Mapping[str, Any]) -> list[Pid]:
    """What still runs of a recorded component: its PIDs, and for a broker or a database the
    processes that name its data directory (one spawned the moment before it was recorded)."""
    pids = [p for p in (Pid.from_json(d) for d in record.get("pids") or []) if p.alive()]
    data = record.get("data") or {}
    if record.get("kind") == "kafka" and data.get("data_dir"):
        root = Path(data["data_dir"])
        for node_dir in (root, *sorted(root.glob("broker-*"))):
            pids += _pids_with_argument(str(node_dir / "server.properties"))
    elif record.get("kind") == "postgres" and data.get("data_dir"):
        pids += _pids_with_argument(str(data["data_dir"]))
    return list(dict.fromkeys(pids))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def _yaml(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return path


class Stack:
    """The stack in `state_dir`: `start()` brings every component up in order, within
    `timeout` seconds, and stops what it started if anything fails or is interrupted;
    `stop()` stops them in reverse (idempotent); `add()` starts one more (the demo's agents),
    stopped with the rest. Also a context manager."""

    def __init__(
        self,
        state_dir: Path,
        options: Options,
        tools: Tools,
        *,
        mode: str,
        say: Say = print,
        timeout: float = 120.0,
    ) -> None:
        self.dir = state_dir.resolve()
        self.options = options
        self.tools = tools
        self.mode = mode
        self.say = say
        self.deadline = time.monotonic() + timeout
        self.components: list[Component] = []
        self.skipped: list[Skipped] = list(tools.skipped)
        self.topics = WorkerTopics(INPUT_TOPIC, FINDINGS_TOPIC, DLQ_TOPIC, GROUP_ID)
        self.kafka: Kafka | None = None
        self.postgres: Postgres | None = None
        self.detectors: list[WorkerProcess] = []
        self._started_at = _now()
        self._saving = threading.Lock()
        self._background: threading.Thread | None = None
        self._background_error: BaseException | None = None

    # -- what it offers -------------------------------------------------------------------

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def kafka_config(self) -> dict[str, Any]:
        assert self.kafka is not None
        return self.kafka.client_config()

    @property
    def dsn(self) -> str | None:
        return None if self.postgres is None else self.postgres.urls.get("dsn")

    def url(self, component: str, key: str = "url") -> str | None:
        for comp in self.components:
            if comp.name == component:
                return comp.urls.get(key)
        return None

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def env(self) -> dict[str, str]:
        """The variables that point a `splitbrain` command (or a worker) at this stack."""
        out = {"SPLITBRAIN_BOOTSTRAP_SERVERS": str(self.kafka_config["bootstrap.servers"])}
        if self.dsn is not None:
            out["SPLITBRAIN_LEASES_DSN"] = self.dsn
        return out

    # -- life -------------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component, last started first (every process is asked at once, then
        each is waited for; the broker and the database go last); every one is tried even when
        one fails."""
        errors = []
        with interrupts.ignored():
            if self._background is not None:
                self._background.join()  # a start in flight ends (bounded by its own timeouts)
            for comp in reversed(self.components):
                if isinstance(comp, Process) and not comp.stopped:
                    comp.signal_stop()
            for comp in reversed(self.components):
                if comp.stopped:
                    continue
                try:
                    comp.stop()
                except (StackError, OSError) as exc:
                    errors.append(f"{comp.name}: {exc}")
            self.save(running=False)
        if errors:
            raise StackError("; ".join(errors))

    def add(self, comp: Component) -> Component:
        """Start `comp` and wait until it is ready; on failure it is stopped with the rest."""
        if self.left() <= 0:
            raise StackError(f"the stack did not start in time (before {comp.name})")
        self.components.append(comp)
        comp.start(self)
        self.save()
        comp.wait_ready(self.deadline)
        return comp

    def save(self, *, running: bool = True) -> None:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "mode": self.mode,
            "state_dir": str(self.dir),
            "owner_pid": os.getpid(),
            "started_at": self._started_at,
            "running": running,
            "components": [c.record() for c in self.components],
            "skipped": [{"name": s.name, "reason": s.reason} for s in self.skipped],
        }
        if self.kafka is not None and self.kafka.urls:
            doc["env"] = self.env()
        if not running:
            doc["stopped_at"] = _now()
        with self._saving:
            _write_json(self.dir / STATE_FILE, doc)

    def prepare(self) -> int:
        """Stop what an earlier run in this directory left running (a run killed by SIGKILL),
        then clear what the stack owns there; how many components were stopped."""
        self.dir.mkdir(parents=True, exist_ok=True)
        stopped = stop_recorded(self.dir, lambda line: None)
        for name in _OWNED:
            path = self.dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        (self.dir / "logs").mkdir()
        return stopped

    def _start(self) -> None:
        if self.tools.postgres:
            # PostgreSQL starts on a thread while the broker starts here: both mostly wait.
            self.postgres = Postgres("postgres", kind="postgres")
            self.components.append(self.postgres)
            self._background = threading.Thread(
                target=self._start_in_background, args=(self.postgres,), daemon=True
            )
            self._background.start()
        self.kafka = Kafka("kafka", kind="kafka")
        self.add(self.kafka)
        self.say(f"started kafka         {self.kafka.urls['bootstrap.servers']}{_pids(self.kafka)}")
        self.say(f"topics: {self.apply_topics()}")
        if self.postgres is not None:
            self._lease_store(self.postgres)
        self._detectors()
        if self.tools.alertmanager is not None:
            self._alertmanager(self.tools.alertmanager)
        if self.tools.prometheus is not None:
            self._prometheus(self.tools.prometheus)
        if self.tools.view:
            self._view()
        if self.tools.pager:
            self._pager()
        self.save()

    def _start_in_background(self, comp: Component) -> None:
        try:
            comp.start(self)
            comp.wait_ready(self.deadline)
        except BaseException as exc:
            self._background_error = exc  # raised again on the main thread

    def _lease_store(self, postgres: Postgres) -> None:
        """PostgreSQL (started in the background), the example destination, the relay."""
        assert self._background is not None
        while self._background.is_alive():  # joined in steps: Ctrl-C must get through
            self._background.join(0.1)
        if self._background_error is not None:
            raise self._background_error
        self.say(f"started postgres      {postgres.urls['dsn']}{_pids(postgres)}")
        dsn = postgres.urls["dsn"]
        env = connection_env(self.kafka_config)
        port = self.options.destination_port or free_port()
        mode = [] if self.options.fenced else ["--unfenced"]
        url = f"http://127.0.0.1:{port}"
        dest = Process(
            "destination",
            urls={"url": url},
            log=self.dir / "logs" / "destination.log",
            argv=[
                *(sys.executable, "-m", "detector.leases.http_destination", "--dsn", dsn),
                *("--listen", f"127.0.0.1:{port}", "--name", DESTINATION_NAME, *mode),
            ],
            env=env,
            ready=functools.partial(_port_open, port),
        )
        self.add(dest)
        fenced = "fenced" if self.options.fenced else "UNFENCED: accepts every fence"
        self.say(f"started destination   {url} ({fenced}){_pids(dest)}")
        relay = Process(
            "relay",
            urls={"topic": INPUT_TOPIC},
            log=self.dir / "logs" / "relay.log",
            argv=[sys.executable, "-m", "detector.cli", "leases", "relay", "--dsn", dsn],
            env=env,
        )
        self.add(relay)
        self.say(f"started relay         tool_job_outbox -> {INPUT_TOPIC}{_pids(relay)}")

    def _detectors(self) -> None:
        """The detector workers, in one group on the product's topics; started together and
        waited for together (each takes a few seconds to join)."""
        started = []
        for n in range(1, self.options.detectors + 1):
            worker = WorkerProcess(
                self.kafka_config,
                self.topics,
                self.dir / "detectors",
                instance=f"detector-{n}",
                metrics_port=free_port(),
            )
            comp = Detector(
                f"detector-{n}",
                urls={"metrics": f"http://127.0.0.1:{worker.metrics_port}/metrics"},
                log=worker.log,
                worker=worker,
                ready=functools.partial(_polling, worker),
                stop_timeout=30.0,
            )
            self.components.append(comp)
            comp.start(self)
            self.detectors.append(worker)
            started.append(comp)
        for comp in started:
            comp.wait_ready(self.deadline)
            self.say(f"started {comp.name:<13} {comp.urls['metrics']}{_pids(comp)}")

    def _view(self) -> None:
        """`splitbrain ui` on loopback: the link of each page goes to its finding there
        (`/healthz` says when it has read the findings topic)."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        view = Process(
            "view",
            urls={"ui": url + "/", "finding": url + "/findings/{finding_id}"},
            log=self.dir / "logs" / "view.log",
            argv=[
                *(sys.executable, "-m", "detector.cli", "ui", "--listen", f"127.0.0.1:{port}"),
            ],
            env=connection_env(self.kafka_config),
            # Not waited for: the pager needs only its address, and it is up long before the
            # first finding (a view that dies is noticed as any component is).
        )
        self.add(view)
        self.say(f"started view          splitbrain ui {url}/{_pids(view)}")

    def _pager(self) -> None:
        am = self.url("alertmanager")
        assert am is not None
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        finding = self.url("view", "finding")
        link = [] if finding is None else ["--finding-url", finding]
        pager = Process(
            "pager",
            urls={"metrics": metrics},
            log=self.dir / "logs" / "pager.log",
            argv=[
                *(sys.executable, "-m", "detector.cli", "page", "--alertmanager-url", am),
                *("--metrics-port", str(port), "--retry-max-s", "5", *link),
            ],
            env=connection_env(self.kafka_config),
            ready=functools.partial(_http_ok, metrics),
        )
        self.add(pager)
        self.say(f"started pager         splitbrain page -> {am}{_pids(pager)}")

    def apply_topics(self) -> str:
        """`splitbrain topics apply --profile local` on one broker, the default (production)
        profile on a cluster: the product's topic names and settings."""
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415

        from detector.kafka.admin import execute, load_topics, plan  # noqa: PLC0415

        profile = "local" if self.options.brokers == 1 else None
        admin = AdminClient({**self.kafka_config, "log_level": 5})
        todo = plan(admin, load_topics(bundled.resource(bundled.TOPICS), profile), 30.0)
        if not todo.empty:
            execute(admin, todo, 30.0, validate_only=False)
        names = ", ".join(t.name for t in todo.create) or "none to create"
        return f"applied {bundled.TOPICS} (profile {profile or 'default'}): {names}"

    def _alertmanager(self, program: str) -> None:
        port = self.options.alertmanager_port or free_port()
        home = self.dir / "alertmanager"
        config = _yaml(
            home / "alertmanager.yml",
            {
                "route": {
                    "receiver": "demo",
                    "group_by": ["alertname", "finding_id"],
                    "group_wait": "1s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                # No notification channel: the demo reads what Alertmanager holds.
                "receivers": [{"name": "demo"}],
            },
        )
        url = f"http://127.0.0.1:{port}"
        comp = Process(
            "alertmanager",
            urls={"url": url, "ui": f"{url}/#/alerts"},
            log=self.dir / "logs" / "alertmanager.log",
            argv=[
                program,
                f"--config.file={config}",
                f"--storage.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip port on every interface
            ],
            ready=lambda: _http_ok(f"{url}/-/ready"),
        )
        self.add(comp)
        self.say(f"started alertmanager  {url}{_pids(comp)}")

    def _prometheus(self, program: str) -> None:
        port = self.options.prometheus_port or free_port()
        home = self.dir / "prometheus"
        rules = home / bundled.RULES.name
        home.mkdir(parents=True, exist_ok=True)
        rules.write_bytes(bundled.resource(bundled.RULES).read_bytes())
        targets = [f"127.0.0.1:{w.metrics_port}" for w in self.detectors]
        alerting: dict[str, Any] = {}
        am = self.url("alertmanager")
        if am is not None:
            target = am.removeprefix("http://")
            alerting = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
        config = _yaml(
            home / "prometheus.yml",
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                **({"alerting": alerting} if alerting else {}),
                "scrape_configs": [
                    {"job_name": SCRAPE_JOB, "static_configs": [{"targets": targets}]}
                ],
            },
        )
        url = f"http://127.0.0.1:{port}"
        comp = Process(
            "prometheus",
            urls={"url": url, "alerts": f"{url}/alerts"},
            log=self.dir / "logs" / "prometheus.log",
            argv=[
                program,
                f"--config.file={config}",
                f"--storage.tsdb.path={home / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            # Ready once it has scraped every detector: a counter's first sample must be
            # its 0, or increase() would not see the first critical finding.
            ready=functools.partial(_scraped, url, len(targets)),
        )
        self.add(comp)
        self.say(f"started prometheus    {url} (rules: {rules.name}){_pids(comp)}")


def _pids(comp: Component) -> str:
    return f" (pid {', '.join(str(p.pid) for p in comp.pids)})" if comp.pids else ""


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0 and sock.getsockname()[1] != port


def _scraped(url: str, targets: int) -> bool:
    """Prometheus is ready and has scraped each of `targets` successfully."""
    if not _http_ok(f"{url}/-/ready"):
        return False
    query = urllib.parse.urlencode({"query": f'up{{job="{SCRAPE_JOB}"}} == 1'})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as answer:
            result = json.loads(answer.read())["data"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(result, list) and len(result) >= targets


def _polling(worker: WorkerProcess) -> bool:
    """The worker serves /metrics and has polled its input (it joined the group)."""
    polls = [
        value
        for (name, _), value in worker.metrics().items()
        if name == "splitbrain_worker_last_poll_timestamp_seconds"
    ]
    return bool(polls) and max(polls) > 0
