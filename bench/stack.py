"""A local broker with fresh topics, and `splitbrain worker` processes, for the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from detector.testing.kafka import LocalKafka


@contextmanager
def broker_with_topics(
    prefix: str, partitions: int = 1
) -> Iterator[tuple[LocalKafka, str, tuple[str, str, str]]]:
    """A broker in a fresh directory (stopped on exit), a tag, and input, findings and DLQ
    topics."""
    workdir = Path(tempfile.mkdtemp(prefix=f"splitbrain-{prefix}-"))
    broker = LocalKafka(workdir / "kafka", extra_jvm_args=["-XX:TieredStopAtLevel=4"])
    broker.start()
    try:
        tag = uuid.uuid4().hex[:6]
        topics = (f"{prefix}-{tag}.in", f"{prefix}-{tag}.findings", f"{prefix}-{tag}.dlq")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
            f.result(30)
        yield broker, tag, topics
    finally:
        broker.stop()


def start_worker(
    bootstrap: str, tag: str, topics: tuple[str, str, str], *extra: str
) -> subprocess.Popen[bytes]:
    """Input, findings and DLQ topics in that order; logs at WARNING so that they cost nothing."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "detector.cli",
            "worker",
            "--bootstrap-servers",
            bootstrap,
            "--instance-id",
            tag,
            "--group-id",
            f"bench-{tag}",
            "--input-topic",
            topics[0],
            "--findings-topic",
            topics[1],
            "--dlq-topic",
            topics[2],
            "--log-level",
            "WARNING",
            *extra,
        ],
        start_new_session=True,
    )


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait(60)
