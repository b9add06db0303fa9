"""A `splitbrain worker` process, started as an operator would start it and stopped by its PID.

The connection (and any password) reaches the worker through `SPLITBRAIN_*` variables, as in
production; the caller's own `SPLITBRAIN_*` variables are not inherited, so a test runs the same
whatever the shell that started it exports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client.parser import text_string_to_metric_families

from detector.devstack.process import free_port
from detector.devstack.topics import WorkerTopics
from detector.kafka.config import ENV_PREFIX, env_name

Labels = tuple[tuple[str, str], ...]


def connection_env(config: Mapping[str, Any], **more: str) -> dict[str, str]:
    """This process's environment without its `SPLITBRAIN_*` variables, plus `config` (librdkafka
    settings) as the `SPLITBRAIN_*` variables a command reads, plus `more`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update({env_name(k): str(v) for k, v in config.items()})
    env.update(more)
    return env


@dataclass
class WorkerProcess:
    """One worker instance; `start` again after `stop` or `kill` to restart it on the same state
    directory and log. A context manager: leaving it kills a worker still running."""

    config: Mapping[str, Any]  # librdkafka client settings: bootstrap servers and security
    topics: WorkerTopics
    workdir: Path
    instance: str = "w1"
    runtime: str = "kafka"
    store: str = "memory"
    metrics_port: int | None = None
    extra: Sequence[str] = ()  # more `splitbrain worker` flags
    # Run with -m: `splitbrain`'s, or a test's worker with a fault in it (`detector.testing`).
    module: str = "detector.cli"
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    starts: int = field(default=0, init=False)

    @property
    def state_dir(self) -> Path:
        return self.workdir / f"state-{self.instance}"

    @property
    def log(self) -> Path:
        return self.workdir / f"worker-{self.instance}.log"

    def argv(self) -> list[str]:
        t = self.topics
        metrics = [] if self.metrics_port is None else ["--metrics-port", str(self.metrics_port)]
        return [
            *(sys.executable, "-m", self.module, "worker"),
            *("--runtime", self.runtime, "--store", self.store),
            *("--instance-id", self.instance, "--group-id", t.group),
            *("--input-topic", t.input, "--findings-topic", t.findings, "--dlq-topic", t.dlq),
            *("--state-dir", str(self.state_dir)),
            *metrics,
            *self.extra,
        ]

    def start(self) -> Self:
        if self.alive():
            raise RuntimeError(f"worker {self.instance} is running already")
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = connection_env(self.config)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.starts += 1
        return self

    def __enter__(self) -> Self:
        return self if self.alive() else self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (after SIGCONT, in case it was paused) and wait; SIGKILL after `timeout`.
        The exit code, or None if it was never started."""
        if self.proc is None:
            return None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: open transactions stay open until a restart fences them."""
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait(30)

    def tail(self, lines: int = 60) -> str:
        """The end of the worker's log, for assertion messages."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def metrics(self) -> dict[tuple[str, Labels], float]:
        """Every sample of the worker's /metrics by (name, sorted labels); empty while it does
        not serve them (not started yet, or no --metrics-port)."""
        if self.metrics_port is None:
            return {}
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def samples(self, name: str, label: str) -> dict[str, float]:
        """One metric's samples by the value of one label (summed over the others)."""
        totals: dict[str, float] = {}
        for (sample, labels), value in self.metrics().items():
            if sample == name:
                key = dict(labels).get(label, "")
                totals[key] = totals.get(key, 0.0) + value
        return totals


@dataclass
class WorkerGroup:
    """The workers of one deployment: one runtime and store, one consumer group on one set of
    topics. Each instance name is one worker, created on first use."""

    config: Mapping[str, Any]
    topics: WorkerTopics
    workdir: Path
    runtime: str = "kafka"
    store: str = "memory"
    extra: Sequence[str] = ()  # flags every worker of the group gets
    workers: dict[str, WorkerProcess] = field(default_factory=dict, init=False)

    def worker(
        self, instance: str, *extra: str, metrics: bool = False, module: str = "detector.cli"
    ) -> WorkerProcess:
        """The worker named `instance` (not started); `extra`, `metrics` and `module` apply
        when it is created."""
        if instance not in self.workers:
            self.workers[instance] = WorkerProcess(
                self.config,
                self.topics,
                self.workdir,
                instance=instance,
                runtime=self.runtime,
                store=self.store,
                metrics_port=free_port() if metrics else None,
                extra=(*self.extra, *extra),
                module=module,
            )
        return self.workers[instance]

    def stop_all(self) -> None:
        for w in self.workers.values():
            w.stop()

    def kill_all(self) -> None:
        for w in self.workers.values():
            w.kill()
