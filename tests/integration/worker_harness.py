"""A `splitbrain worker` process on fresh topics of a real broker, for the end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from detector.testing.kafka import LocalKafka, free_port

PARTITIONS = 3


def cli(*args: str, bootstrap: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detector.cli", *args, "--bootstrap-servers", bootstrap],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Running:
    """A worker process on fresh topics; stopped by its PID."""

    def __init__(self, broker: LocalKafka, tmp: Path, *extra: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.bootstrap = broker.bootstrap
        self.input, self.findings, self.dlq = (f"w-{tag}.in", f"w-{tag}.findings", f"w-{tag}.dlq")
        self.group = f"g-{tag}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        big = {"max.message.bytes": str(4 * 1024 * 1024)}
        futures = admin.create_topics(
            [
                NewTopic(self.input, PARTITIONS, 1),
                NewTopic(self.findings, PARTITIONS, 1),
                NewTopic(self.dlq, PARTITIONS, 1, config=big),
            ]
        )
        for f in futures.values():
            f.result(30)
        self.metrics_port = free_port()
        self.log = tmp / "worker.log"
        self.extra = extra
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "detector.cli",
                "worker",
                "--bootstrap-servers",
                self.bootstrap,
                "--instance-id",
                "it-1",
                "--group-id",
                self.group,
                "--input-topic",
                self.input,
                "--findings-topic",
                self.findings,
                "--dlq-topic",
                self.dlq,
                "--metrics-port",
                str(self.metrics_port),
                *self.extra,
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()

    def read_all(self, topic: str) -> list[tuple[bytes | None, bytes, dict[str, bytes]]]:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"r-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out, pending = [], set(range(PARTITIONS))
        try:
            while pending:
                for msg in consumer.consume(100, timeout=1.0):
                    err = msg.error()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition() or 0)
                    elif err is None:
                        headers = {k: v or b"" for k, v in msg.headers() or []}
                        out.append((msg.key(), msg.value() or b"", headers))
        finally:
            consumer.close()
        return out


def metrics_or_empty(w: Running) -> str:
    try:
        return w.metrics()
    except OSError:
        return ""  # not listening yet


def samples(w: Running, name: str) -> dict[str, float]:
    """One metric's samples by their partition label ("" for an unlabelled metric)."""
    return {
        sample.labels.get("partition", ""): sample.value
        for family in text_string_to_metric_families(metrics_or_empty(w))
        for sample in family.samples
        if sample.name == name
    }
