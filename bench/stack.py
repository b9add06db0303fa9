"""A local broker with fresh topics, and `splitbrain worker` processes, for the benchmarks."""

from __future__ import annotations

import os
import platform
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from detector.devstack.kafka import LocalKafka
from detector.devstack.kafka_cluster import AnyKafka
from detector.devstack.topics import WorkerTopics
from detector.devstack.worker import WorkerProcess


@contextmanager
def broker_with_topics(
    prefix: str, partitions: int = 1, broker_config: Mapping[str, str] | None = None
) -> Iterator[tuple[LocalKafka, WorkerTopics]]:
    """A broker in a fresh directory (stopped on exit), with a worker's topics on it;
    `broker_config` over its defaults."""
    workdir = Path(tempfile.mkdtemp(prefix=f"splitbrain-{prefix}-"))
    broker = LocalKafka(
        workdir / "kafka", extra_jvm_args=["-XX:TieredStopAtLevel=4"], broker_config=broker_config
    )
    broker.start()
    try:
        yield broker, WorkerTopics.fresh(prefix).create(broker.client_config(), partitions)
    finally:
        broker.stop()


def outputs_on(broker: LocalKafka, input_topic: str, prefix: str, partitions: int) -> WorkerTopics:
    """Fresh findings and DLQ topics and a fresh group on an existing input: every consumer of
    one published history starts from nothing (a fresh set is created and its own, empty, input
    topic left unused)."""
    fresh = WorkerTopics.fresh(prefix).create(broker.client_config(), partitions)
    return replace(fresh, input=input_topic)


def machine() -> str:
    """What the numbers were measured on: the broker shares the machine's cores."""
    return (
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, python "
        f"{platform.python_version()}; broker on the same machine"
    )


def start_worker(
    broker: AnyKafka,
    topics: WorkerTopics,
    *extra: str,
    metrics_port: int | None = None,
    runtime: str = "kafka",
    instance: str = "bench",
    module: str = "detector.cli",
) -> WorkerProcess:
    """A worker logging at WARNING, so that its logs cost nothing; /metrics on `metrics_port`.
    Workers of one broker that run one after another take an `instance` each: their own state
    directory and log."""
    return WorkerProcess(
        broker.client_config(),
        topics,
        broker.data_dir.parent / "workers",
        instance=instance,
        runtime=runtime,
        metrics_port=metrics_port,
        extra=("--log-level", "WARNING", *extra),
        module=module,
    ).start()


def vm_kb(pid: int, field: str = "VmRSS") -> int | None:
    """A memory figure of a process from /proc/<pid>/status, in kB (None: the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return None
    return None
