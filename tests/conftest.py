"""Shared fixtures: real local Kafka brokers started by `detector.devstack.kafka`.

The brokers are session-scoped (a JVM start costs seconds) and are stopped by PID at the end of
the session; the SASL_SSL one and the three-broker cluster start only if some test asks for them.
Tests that need a broker live under tests/integration and tests/torture, whose conftests mark
them `kafka`, so `pytest -m "not kafka"` runs the unit tests with no JVM at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from hypothesis import HealthCheck, Phase, settings

from detector.devstack.kafka import LocalKafka
from detector.devstack.kafka_cluster import LocalKafkaCluster

if TYPE_CHECKING:
    from selenium import webdriver

# Hypothesis profiles, one mechanism for every property test (tests/unit/test_properties.py,
# tests/unit/test_campaign.py): SPLITBRAIN_HYPOTHESIS_PROFILE names one; without it, `ci` when
# CI is set and `dev` otherwise. pytest's own `--hypothesis-profile NAME` overrides both.
# - `ci`: derandomised (the same examples on every run, so a red run is red again on a rerun), a
#   short budget, and no shrinking (a failure is reported at once, with the blob that reproduces
#   it, instead of shrinking a long history for minutes);
# - `dev`: the same budget, random (each local run looks somewhere new);
# - `slow`: the slow job's long random budget (`make slow`).
# A test that scales its budget takes a share of `settings.default.max_examples`. Every failure
# prints its reproduction blob; keep it as an explicit example (tests/unit/regressions.py).
PROFILE_ENV: Final = "SPLITBRAIN_HYPOTHESIS_PROFILE"
_PROPERTIES: Final = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "ci",
    _PROPERTIES,
    max_examples=100,
    derandomize=True,
    phases=[p for p in Phase if p is not Phase.shrink],
)
settings.register_profile("dev", _PROPERTIES, max_examples=100)
settings.register_profile("slow", _PROPERTIES, max_examples=2500)
settings.load_profile(os.environ.get(PROFILE_ENV) or ("ci" if os.environ.get("CI") else "dev"))


def mark_directory(items: list[pytest.Item], directory: Path, *marks: pytest.MarkDecorator) -> None:
    """Mark every collected test under `directory` (collection hooks see the whole session)."""
    for item in items:
        if directory in item.path.resolve().parents:
            for mark in marks:
                item.add_marker(mark)


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


@pytest.fixture(scope="session")
def _kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    cluster = LocalKafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), brokers=3)
    cluster.start()  # on failure it kills what it started and raises
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_cluster(_kafka_cluster: LocalKafkaCluster) -> Iterator[LocalKafkaCluster]:
    """Three brokers (KRaft, internal topics at replication 3 and min ISR 2), shared by the
    session: a test may kill, pause or restart nodes; afterwards every node runs again and
    every partition is back in sync, so the next test gets a whole cluster."""
    yield _kafka_cluster
    for node_id, node in _kafka_cluster.nodes.items():
        if node.pid() is None:
            _kafka_cluster.restart(node_id)
        else:
            node.resume()  # a no-op unless the test left it paused
    _kafka_cluster.wait_in_sync()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Debian's chromium, driven by Selenium through Debian's chromium-driver (the HTML report's
    and the findings view's tests)."""
    from detector.testing.view import chromium  # noqa: PLC0415 (selenium only where it is used)
    from tests.tools import program  # noqa: PLC0415

    with chromium(
        program("chromium", package="chromium"),
        program("chromedriver", package="chromium-driver"),
        tmp_path_factory.mktemp("chromium-profile"),
    ) as driver:
        yield driver
