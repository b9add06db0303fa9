"""The stack's components, each a server it starts, waits for and stops by PID: a program
(`Process`), a detector worker (`DetectorWorker`), the broker (`Kafka`) and PostgreSQL with the
lease store (`Postgres`). `stop_record` stops one from its entry in `stack.json`, from any
process."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, Literal

from detector.devstack.errors import StackError
from detector.devstack.interrupts import interrupts
from detector.devstack.kafka import DevKafkaError, LocalKafka
from detector.devstack.kafka_cluster import LocalKafkaCluster, open_kafka
from detector.devstack.process import Pid, log_tail, pids_with_argument, send, stop_pids
from detector.devstack.worker import WorkerProcess

if TYPE_CHECKING:
    from detector.devstack.stack import Stack

DATABASE: Final = "jobs"


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
            send(p, signal.SIGCONT)
            send(p, self.stop_signal)

    def record(self) -> dict[str, Any]:
        doc = super().record()
        doc["stop_signal"] = signal.Signals(self.stop_signal).name
        doc["stop_timeout"] = self.stop_timeout
        return doc

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.poll()


@dataclass
class DetectorWorker(Process):
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
    pids = leftovers(record)
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


def leftovers(record: Mapping[str, Any]) -> list[Pid]:
    """What still runs of a recorded component: its PIDs, and for a broker or a database the
    processes that name its data directory (one spawned the moment before it was recorded)."""
    pids = [p for p in (Pid.from_json(d) for d in record.get("pids") or []) if p.alive()]
    data = record.get("data") or {}
    if record.get("kind") == "kafka" and data.get("data_dir"):
        root = Path(data["data_dir"])
        for node_dir in (root, *sorted(root.glob("broker-*"))):
            pids += pids_with_argument(str(node_dir / "server.properties"))
    elif record.get("kind") == "postgres" and data.get("data_dir"):
        pids += pids_with_argument(str(data["data_dir"]))
    return list(dict.fromkeys(pids))


def pid_note(comp: Component) -> str:
    return f" (pid {', '.join(str(p.pid) for p in comp.pids)})" if comp.pids else ""
