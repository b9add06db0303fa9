"""Integration tests run against a real local Kafka broker started by `detector.devkafka`.

Every test in this directory is marked `kafka`, so `pytest -m "not kafka"` runs the unit tests
with no JVM at all. The brokers are session-scoped (a JVM start costs seconds) and are stopped
by PID at the end of the session; the SASL_SSL one starts only if some test asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from detector.devkafka import LocalKafka

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration `kafka` (the hook sees the whole session)."""
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.kafka)


def _run_broker(data_dir: Path, *, sasl_ssl: bool) -> Iterator[LocalKafka]:
    broker = LocalKafka(data_dir, sasl_ssl=sasl_ssl)
    broker.start()  # on failure it kills what it started and raises with the log tail
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A PLAINTEXT broker: `.bootstrap`, `.client_config()`, `.kill_and_restart()`, `.pause()`."""
    yield from _run_broker(tmp_path_factory.mktemp("kafka"), sasl_ssl=False)


@pytest.fixture(scope="session")
def kafka_sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A SASL_SSL + SCRAM-SHA-512 broker: `.client_config()` has the user, password and CA."""
    yield from _run_broker(tmp_path_factory.mktemp("kafka-sasl"), sasl_ssl=True)
