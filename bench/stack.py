"""A local broker with fresh topics, and `splitbrain worker` processes, for the benchmarks."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from detector.testing.kafka import LocalKafka
from detector.testing.topics import WorkerTopics
from detector.testing.worker import WorkerProcess


@contextmanager
def broker_with_topics(
    prefix: str, partitions: int = 1
) -> Iterator[tuple[LocalKafka, WorkerTopics]]:
    """A broker in a fresh directory (stopped on exit), with a worker's topics on it."""
    workdir = Path(tempfile.mkdtemp(prefix=f"splitbrain-{prefix}-"))
    broker = LocalKafka(workdir / "kafka", extra_jvm_args=["-XX:TieredStopAtLevel=4"])
    broker.start()
    try:
        yield broker, WorkerTopics.fresh(prefix).create(broker.client_config(), partitions)
    finally:
        broker.stop()


def start_worker(broker: LocalKafka, topics: WorkerTopics, *extra: str) -> WorkerProcess:
    """A worker logging at WARNING, so that its logs cost nothing."""
    return WorkerProcess(
        broker.client_config(),
        topics,
        broker.data_dir.parent / "workers",
        instance="bench",
        extra=("--log-level", "WARNING", *extra),
    ).start()
