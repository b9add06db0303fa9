"""The lease store page's first block, run as written (issue 38): its DSN and broker stand for the
reader's, so the test's take their place; `migrate` runs to its end, and the two long-running
commands are each started, seen doing their work, and stopped by their PID with SIGTERM.

The relay is seen publishing a job's events to `agent.ownership.v1`; the detector is seen
committing offsets of that topic in its consumer group. The block assumes a broker with the
topics, so the test applies them first (`splitbrain topics apply --profile local`), and deletes
after what it created."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg.rows import DictRow

from detector.contracts.topics import INPUT_TOPIC
from detector.devstack.kafka import LocalKafka
from detector.leases import LeaseStore
from detector.leases.db import connect
from tests import docs
from tests.integration.leases import claimed, count, job_class

PAGE = docs.DOCS / "lease-store" / "index.md"
GROUP = "splitbrain-detector"  # the worker's default consumer group
WITHIN_S = 120


def the_block() -> list[str]:
    """The page's first shell block, a command a line."""
    block = next(b for b in docs.blocks(PAGE) if b.language == "sh")
    return block.text.splitlines()


@pytest.fixture
def shell(tmp_path: Path) -> dict[str, str]:
    """A reader's shell: `splitbrain` on PATH, no SPLITBRAIN_* of this machine's."""
    command = tmp_path / "bin" / "splitbrain"
    command.parent.mkdir()
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m detector.cli "$@"\n')
    command.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLITBRAIN_")}
    env["PATH"] = f"{command.parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


@pytest.fixture
def default_topics(kafka_broker: LocalKafka, shell: dict[str, str]) -> Iterator[AdminClient]:
    config = kafka_broker.client_config()
    admin = AdminClient(config)
    before = set(admin.list_topics(timeout=30).topics)
    subprocess.run(
        [
            *("splitbrain", "topics", "apply", "--profile", "local"),
            *("--bootstrap-servers", kafka_broker.bootstrap),
        ],
        env=shell,
        check=True,
        capture_output=True,
        timeout=WITHIN_S,
    )
    yield admin
    admin.delete_consumer_groups([GROUP])
    created = set(admin.list_topics(timeout=30).topics) - before
    if created:
        admin.delete_topics(sorted(created))


def test_the_page_s_first_block_runs_as_written(
    empty_postgres_dsn: str,
    kafka_broker: LocalKafka,
    shell: dict[str, str],
    default_topics: AdminClient,
    tmp_path: Path,
) -> None:
    export, migrate, relay, worker = the_block()
    assert export.startswith("export SPLITBRAIN_LEASES_DSN=")
    bootstrap = kafka_broker.bootstrap
    env = {**shell, "SPLITBRAIN_LEASES_DSN": empty_postgres_dsn}  # the export, for this database

    def started(line: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", "-c", "exec " + line.replace("kafka:9092", bootstrap)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    done = subprocess.run(
        ["bash", "-c", migrate],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=WITHIN_S,
    )
    assert done.returncode == 0 and "schema at version" in done.stdout, done

    relaying, detecting = started(relay), started(worker)
    try:
        with LeaseStore(empty_postgres_dsn, [job_class("ocr", lease_s=60)]) as store:
            store.enqueue("ocr", "doc:1:ocr", {})
            store.complete(claimed(store.claim("ocr", "w1")), {})
        with connect(empty_postgres_dsn) as db:
            wait_for(lambda: unrelayed(db) == 0, relaying, "the relay published the job's events")
        wait_for(lambda: committed(default_topics) > 0, detecting, "the detector read them")
    finally:
        for proc in (relaying, detecting):
            os.kill(proc.pid, signal.SIGTERM)
    for proc in (relaying, detecting):
        out, _ = proc.communicate(timeout=WITHIN_S)
        assert proc.returncode == 0, out


def wait_for(done: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not done():
        assert proc.poll() is None, f"{what}: exited\n{proc.communicate()[0]}"
        assert time.monotonic() < deadline, f"{what}: not within {WITHIN_S} s"
        time.sleep(0.2)


def unrelayed(db: psycopg.Connection[DictRow]) -> int:
    return count(db, "SELECT count(*) AS n FROM tool_job_outbox WHERE relayed_at IS NULL")


def committed(admin: AdminClient) -> int:
    """Offsets the detector's group committed on the input topic, summed."""
    topics = admin.list_topics(INPUT_TOPIC, timeout=10).topics[INPUT_TOPIC].partitions
    asked = ConsumerGroupTopicPartitions(GROUP, [TopicPartition(INPUT_TOPIC, p) for p in topics])
    answer = admin.list_consumer_group_offsets([asked])[GROUP].result()
    return sum(max(tp.offset, 0) for tp in answer.topic_partitions)
