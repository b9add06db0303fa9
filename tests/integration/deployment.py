"""A worker deployment for the end-to-end tests: fresh topics on a real broker, the workers a test
starts on them (killed when it ends), and the command line and waiting that tests share."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from detector.devstack.kafka_cluster import AnyKafka
from detector.devstack.topics import Record, TopicReader, WorkerTopics
from detector.devstack.worker import WorkerGroup, WorkerProcess
from detector.histories.audit import audit_lines
from tests.paths import SEED_FIXTURE

PARTITIONS = 3
DEADLINE_S = 120.0
RUNTIMES = ("kafka", "faust")

Finding = dict[str, Any]


class Deployment:
    def __init__(
        self, broker: AnyKafka, workdir: Path, runtime: str, store: str, replication: int = 1
    ) -> None:
        self.broker = broker
        self.config = broker.client_config()
        self.runtime = runtime
        self.topics = WorkerTopics.fresh(f"it-{runtime}").create(
            self.config, PARTITIONS, replication=replication
        )
        self.group = WorkerGroup(self.config, self.topics, workdir, runtime, store)

    def worker(
        self, instance: str = "w1", *extra: str, module: str = "detector.cli"
    ) -> WorkerProcess:
        """A started worker with /metrics; the same name restarts on the same state and log.
        `module`: run with -m (`WorkerProcess.module`)."""
        return self.group.worker(instance, *extra, metrics=True, module=module).start()

    def reader(self, topic: str) -> TopicReader:
        return TopicReader(self.config, topic)

    def publish(self, records: Iterable[tuple[bytes, bytes]], partition: int | None = None) -> None:
        producer = Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})
        for key, value in records:
            if partition is None:
                producer.produce(self.topics.input, key=key, value=value)
            else:
                producer.produce(self.topics.input, key=key, value=value, partition=partition)
            producer.poll(0)
        assert producer.flush(30) == 0

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, bootstrap=self.broker.bootstrap)

    def close(self) -> None:
        self.group.kill_all()


def cli(*args: str, bootstrap: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detector.cli", *args, "--bootstrap-servers", bootstrap],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout: float = DEADLINE_S,
    workers: Sequence[WorkerProcess] = (),
) -> None:
    """Until `condition()`; fails at once, with its log, when one of `workers` exited."""
    deadline = time.monotonic() + timeout
    while not condition():
        for w in workers:
            assert w.alive(), f"worker {w.instance} exited {w.exit_code()}:\n{w.tail()}"
        if time.monotonic() > deadline:
            logs = "\n".join(w.tail() for w in workers[-1:])
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(0.2)


def fixture_lines() -> list[bytes]:
    return [line for line in SEED_FIXTURE.read_bytes().splitlines() if line.strip()]


def keyed(lines: Iterable[bytes]) -> list[tuple[bytes, bytes]]:
    return [(json.loads(line)["workflow_key"].encode(), line) for line in lines]


def audited(lines: list[bytes]) -> dict[str, Finding]:
    """What `audit` finds in the same history: the latest revision of every finding."""
    result = audit_lines(iter(lines))
    return {fid: json.loads(f.to_json()) for fid, f in result.findings.items()}


def latest(records: Iterable[Record]) -> dict[str, Finding]:
    out: dict[str, Finding] = {}
    for record in records:
        doc = json.loads(record.value)
        old = out.get(doc["finding_id"])
        if old is None or doc["revision"] > old["revision"]:
            out[doc["finding_id"]] = doc
    return out


def finding_with(
    deployment: Deployment, want: set[str], workers: Sequence[WorkerProcess]
) -> Finding:
    """The latest revision of the first finding on `deployment`'s findings topic that lists
    every condition kind in `want`, waited for (failing at once if one of `workers` exited)."""
    found: list[Finding] = []
    with deployment.reader(deployment.topics.findings) as reader:

        def listed() -> bool:
            reader.poll(0.5)
            found[:] = [
                f
                for f in latest(reader.records).values()
                if want <= {c["kind"] for c in f["conditions"]}
            ]
            return bool(found)

        wait_for(listed, f"a finding with {sorted(want)}", DEADLINE_S, workers)
    return found[0]


def assert_each_revision_once(records: Iterable[Record]) -> None:
    """No (finding_id, revision) published twice, and every finding's revisions are 1, 2, … in
    order, with none skipped."""
    by_id: dict[str, list[int]] = {}
    for record in records:
        doc = json.loads(record.value)
        by_id.setdefault(doc["finding_id"], []).append(doc["revision"])
    for fid, revisions in by_id.items():
        assert revisions == list(range(1, len(revisions) + 1)), f"{fid}: revisions {revisions}"
