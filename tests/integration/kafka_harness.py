"""Shared helpers for the tests of the Kafka commands: the CLI in a subprocess, unique topics,
a reader that waits for a count rather than for a while, and Java's partitioner."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypedDict

import yaml
from confluent_kafka import IsolationLevel
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from detector.devstack.kafka_cluster import AnyKafka
from detector.devstack.topics import Record, TopicReader, create_topics
from detector.devstack.worker import connection_env

REPO = Path(__file__).resolve().parents[2]
TOPICS_FILE = REPO / "topics" / "topics.yaml"

TIMEOUT = 30.0


class OwnerFields(TypedDict):
    """The owner every `Emitter` helper needs (the required part of `detector.kafka.emit.Fields`),
    to spread into several calls that each add their own optional fields."""

    workflow_key: str
    owner_epoch: int
    worker_id: str


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def broker_env(broker: AnyKafka, **overrides: str) -> dict[str, str]:
    """The broker's client settings as the SPLITBRAIN_* environment the commands read."""
    return connection_env(broker.client_config(), **overrides)


def splitbrain(
    *argv: str, env: Mapping[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real command line, as an operator would."""
    return subprocess.run(
        [sys.executable, "-m", "detector.cli", *argv],
        env=dict(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


def create_topic(broker: AnyKafka, name: str, partitions: int) -> str:
    create_topics(broker.client_config(), [NewTopic(name, partitions, 1)], TIMEOUT)
    return name


def delete_topics(broker: AnyKafka, names: list[str]) -> None:
    admin = AdminClient(broker.client_config())
    for future in admin.delete_topics(names, operation_timeout=TIMEOUT).values():
        future.result(timeout=TIMEOUT)


@contextlib.contextmanager
def renamed_topics_file(broker: AnyKafka, directory: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The real topics.yaml with unique topic names, so a test owns the topics it applies;
    whichever of them the test created are deleted afterwards."""
    spec = yaml.safe_load(TOPICS_FILE.read_text())
    names = {name: unique(name) for name in spec["topics"]}
    spec["topics"] = {names[name]: config for name, config in spec["topics"].items()}
    path = directory / "topics.yaml"
    path.write_text(yaml.safe_dump(spec))
    yield path, names
    existing = AdminClient(broker.client_config()).list_topics(timeout=TIMEOUT).topics
    created = [name for name in names.values() if name in existing]
    if created:
        delete_topics(broker, created)


def read_topic(broker: AnyKafka, topic: str, count: int) -> list[Record]:
    """Every record of `topic`, which must be exactly `count` (a duplicate would otherwise go
    unnoticed). Read uncommitted: the emitter and replay do not write in transactions."""
    config = broker.client_config()
    with TopicReader(config, topic, isolation=IsolationLevel.READ_UNCOMMITTED) as reader:
        records = reader.read_to_end(TIMEOUT)
    assert len(records) == count, f"{topic}: {len(records)} records, expected {count}"
    return records


def murmur2(data: bytes) -> int:
    """Kafka's Java `Utils.murmur2` (seed 0x9747b28c), as a signed 32-bit int."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    body = length - length % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = data[body:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """Java's DefaultPartitioner for a keyed record: `toPositive(murmur2(key)) % partitions`."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
