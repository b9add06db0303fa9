"""The local broker is a real Kafka: metadata, transactions, crash recovery, SASL_SSL + SCRAM.

These tests pin the properties the rest of the suite relies on: read_committed hides aborted
transactions, a `kill -9` loses nothing committed, and the secure listener refuses bad
credentials with an error instead of a hang.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from detector.devstack.kafka import ClientConfig, LocalKafka
from detector.devstack.topics import TopicReader, create_topics

TIMEOUT = 30.0


def _create_topic(conf: ClientConfig, partitions: int = 1) -> str:
    topic = f"test-devkafka-{uuid.uuid4().hex[:10]}"
    create_topics(conf, [NewTopic(topic, partitions, 1)], TIMEOUT)
    return topic


def _read_all(
    conf: ClientConfig, topic: str, isolation: IsolationLevel = IsolationLevel.READ_COMMITTED
) -> list[bytes]:
    """Every value readable in `topic` now, in log order (single-partition topics here)."""
    with TopicReader(conf, topic, isolation=isolation) as reader:
        return [record.value for record in reader.read_to_end(TIMEOUT)]


def _transactional_producer(conf: ClientConfig) -> Producer:
    producer = Producer({**conf, "transactional.id": f"tx-{uuid.uuid4().hex[:10]}"})
    producer.init_transactions(TIMEOUT)
    return producer


def _in_transaction(producer: Producer, topic: str, value: bytes, *, commit: bool) -> None:
    producer.begin_transaction()
    producer.produce(topic, value)
    if commit:
        producer.commit_transaction(TIMEOUT)
    else:
        producer.flush(TIMEOUT)  # the record is in the log, only its transaction is aborted
        producer.abort_transaction(TIMEOUT)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_broker_answers_metadata(kafka_broker: LocalKafka) -> None:
    metadata = AdminClient(kafka_broker.client_config()).list_topics(timeout=TIMEOUT)
    addresses = [f"{b.host}:{b.port}" for b in metadata.brokers.values()]
    assert addresses == [kafka_broker.bootstrap]
    status = kafka_broker.status()
    assert status.running
    assert status.pid == kafka_broker.pid()
    assert kafka_broker.log_path.stat().st_size > 0  # the broker logs to its file


def test_read_committed_sees_committed_not_aborted(kafka_broker: LocalKafka) -> None:
    conf = kafka_broker.client_config()
    topic = _create_topic(conf)
    producer = _transactional_producer(conf)
    _in_transaction(producer, topic, b"committed-1", commit=True)
    _in_transaction(producer, topic, b"aborted", commit=False)
    _in_transaction(producer, topic, b"committed-2", commit=True)

    assert _read_all(conf, topic) == [b"committed-1", b"committed-2"]
    # The aborted record did reach the log: read_uncommitted shows it.
    assert b"aborted" in _read_all(conf, topic, IsolationLevel.READ_UNCOMMITTED)


def test_kill_and_restart_keeps_committed_data(kafka_broker: LocalKafka) -> None:
    conf = kafka_broker.client_config()
    topic = _create_topic(conf)
    producer = _transactional_producer(conf)
    _in_transaction(producer, topic, b"before-crash", commit=True)
    old_pid, old_bootstrap = kafka_broker.pid(), kafka_broker.bootstrap

    kafka_broker.kill_and_restart()

    assert kafka_broker.pid() not in (None, old_pid)
    assert kafka_broker.bootstrap == old_bootstrap
    assert _read_all(conf, topic) == [b"before-crash"]
    after = _transactional_producer(conf)
    _in_transaction(after, topic, b"after-crash", commit=True)
    assert _read_all(conf, topic) == [b"before-crash", b"after-crash"]


def test_pause_stalls_and_resume_recovers(kafka_broker: LocalKafka) -> None:
    admin = AdminClient(kafka_broker.client_config())
    kafka_broker.pause()
    try:
        assert kafka_broker.status().running  # stopped, not dead
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=2)
    finally:
        kafka_broker.resume()
    _wait_for(lambda: bool(_metadata_or_none(admin)), "metadata after resume")


def _metadata_or_none(admin: AdminClient) -> Any:
    try:
        return admin.list_topics(timeout=1).brokers
    except KafkaException:
        return None


def test_sasl_ssl_accepts_right_scram_credentials(kafka_sasl_broker: LocalKafka) -> None:
    conf = kafka_sasl_broker.client_config()
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    topic = _create_topic(conf)
    producer = _transactional_producer(conf)
    _in_transaction(producer, topic, b"over-tls", commit=True)
    assert _read_all(conf, topic) == [b"over-tls"]


def test_sasl_ssl_rejects_wrong_password_quickly(kafka_sasl_broker: LocalKafka) -> None:
    errors: list[KafkaError] = []
    producer = Producer(
        {
            **kafka_sasl_broker.client_config(),
            "sasl.password": "not-the-password",
            "error_cb": errors.append,
        }
    )
    started = time.monotonic()
    producer.produce("never-created", b"x")
    deadline = started + 15
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, f"no authentication error within 15s: {errors}"
        producer.poll(0.2)
    assert "SCRAM-SHA-512" in str([e.str() for e in errors])
    producer.purge()
    producer.flush(1)


def test_cli_start_status_stop(tmp_path: Path) -> None:
    """`splitbrain dev kafka ...` as a user runs it: a separate process per command."""
    data_dir = tmp_path / "kafka"

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "detector.cli",
                "dev",
                "kafka",
                *argv,
                "--data-dir",
                str(data_dir),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    try:
        started = cli("start")
        assert started.returncode == 0, started.stdout + started.stderr
        last = started.stdout.strip().splitlines()[-1]
        assert last.startswith("bootstrap.servers=127.0.0.1:")
        bootstrap = last.split("=", 1)[1]
        pid = int((data_dir / "kafka.pid").read_text())

        status = cli("status")
        assert status.returncode == 0
        assert f"pid={pid}" in status.stdout
        assert f"bootstrap.servers={bootstrap}" in status.stdout
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=TIMEOUT)
        assert metadata.brokers

        assert cli("stop").returncode == 0
        assert cli("status").returncode == 1
        assert cli("start", "--kill").returncode == 1  # nothing to kill
    finally:
        LocalKafka(data_dir).stop()  # by PID, whatever state the test left it in
