"""Shared fixtures: real local Kafka brokers started by `detector.devstack.kafka`, the external
programs some tests run, and the markers by cost every test gets here.

The brokers are session-scoped (a JVM start costs seconds) and are stopped by PID at the end of
the session; the SASL_SSL one and the three-broker cluster start only if some test asks for them.
Under pytest-xdist a session is a worker's: each worker starts its own, on free ports in its own
temporary directories.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from hypothesis import HealthCheck, Phase, settings

from detector.devstack.kafka import KAFKA4_POM, LocalKafka
from detector.devstack.kafka_cluster import LocalKafkaCluster
from tests.tools import program

if TYPE_CHECKING:
    from selenium import webdriver

# pytester: tests/unit/test_no_skip_in_ci.py runs these hooks in a pytest of its own.
pytest_plugins = ("pytester",)

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


# Markers by cost (registered in pyproject.toml), set here from where a test lives and what it
# uses, so that no test file has to remember them: `unit` is what is left once a test talks to a
# server or runs a program (`integration`) or drives chromium (`browser`); `pytest -m unit` is the
# fast suite (`make unit`).
TESTS: Final = Path(__file__).resolve().parent
_BY_DIRECTORY: Final = {
    TESTS / "integration": ("kafka", "integration"),
    TESTS / "torture": ("kafka", "integration", "torture"),
}
_BY_FIXTURE: Final = {
    "browser": "browser",
    "redis_server": "integration",  # Debian's redis-server (tests/unit/test_adapter_redis_lock.py)
    "promtool": "integration",
    "amtool": "integration",
    "docker_compose": "integration",
}
# pytest-xdist's `--dist loadgroup` runs each group on one worker, one test at a time: the tests
# that would each start a heavy resource per worker (the three brokers, the SASL_SSL broker), and
# those that load the machine for minutes and must not overlap (the torture runs, the full stacks
# of the demos and of the installed wheel).
_GROUP_BY_FIXTURE: Final = {"kafka_cluster": "kafka-cluster", "kafka_sasl_broker": "kafka-sasl"}
_GROUP_BY_FILE: Final = {
    TESTS / "torture" / "test_torture.py": "stacks",
    TESTS / "integration" / "test_demo.py": "stacks",
    TESTS / "integration" / "test_installed_wheel.py": "stacks",
}
_COSTLY: Final = frozenset({"integration", "browser"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.resolve()
        fixtures = set(getattr(item, "fixturenames", ()))
        names = {n for d, marks in _BY_DIRECTORY.items() if d in path.parents for n in marks}
        names |= {_BY_FIXTURE[f] for f in fixtures & _BY_FIXTURE.keys()}
        if not (names | {m.name for m in item.iter_markers()}) & _COSTLY:
            names.add("unit")
        for name in sorted(names):
            item.add_marker(name)
        # One group a test (xdist reads one): its file's, else its heavy fixture's.
        by_fixture = (g for f, g in _GROUP_BY_FIXTURE.items() if f in fixtures)
        group = _GROUP_BY_FILE.get(path) or next(by_fixture, None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


# No skip in CI: `.ci/run` and `.ci/slow` install every tool, extra and server the suite uses and
# set SPLITBRAIN_REQUIRE_TOOLS=1, so a skip there means something is missing; it fails instead
# (whatever skipped it: `tests.tools.program`, `importorskip`, a `skipif`). What a run leaves
# out is deselected by its marker (`-m "not slow"`), never skipped. An xfail stays an xfail.
def _failed_for_skipping(report: pytest.TestReport | pytest.CollectReport) -> None:
    required = os.environ.get("SPLITBRAIN_REQUIRE_TOOLS") == "1"
    if required and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under SPLITBRAIN_REQUIRE_TOOLS=1, which allows none: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _failed_for_skipping(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _failed_for_skipping(report)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The count CI is judged on, printed even when it is 0 (pytest's summary leaves it out)."""
    skipped = len(terminalreporter.stats.get("skipped", []))
    terminalreporter.write_line(f"skipped: {skipped}")


def _run_broker(broker: LocalKafka) -> Iterator[LocalKafka]:
    broker.start()  # on failure it kills what it started and raises with the log tail
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A PLAINTEXT broker: `.bootstrap`, `.client_config()`, `.kill_and_restart()`, `.pause()`."""
    yield from _run_broker(LocalKafka(tmp_path_factory.mktemp("kafka"), sasl_ssl=False))


@pytest.fixture(scope="session")
def kafka_sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A SASL_SSL + SCRAM-SHA-512 broker: `.client_config()` has the user, password and CA."""
    yield from _run_broker(LocalKafka(tmp_path_factory.mktemp("kafka-sasl"), sasl_ssl=True))


@pytest.fixture(scope="session")
def kafka4_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A PLAINTEXT Kafka 4.x broker (`detector/devstack/pom-kafka4.xml`), for what the project's
    3.9 does not serve: the consumer group protocol of KIP-848. Only slow tests use it."""
    yield from _run_broker(LocalKafka(tmp_path_factory.mktemp("kafka4"), pom=KAFKA4_POM))


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


@pytest.fixture(scope="session")
def promtool() -> str:
    return program("promtool", package="prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    return program("amtool", package="prometheus-alertmanager")


@pytest.fixture(scope="session")
def docker_compose() -> str:
    return program("docker-compose", package="docker-compose")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Debian's chromium, driven by Selenium through Debian's chromium-driver (the HTML report's
    and the findings view's tests)."""
    from detector.testing.view import chromium  # noqa: PLC0415 (selenium only where it is used)

    with chromium(
        program("chromium", package="chromium"),
        program("chromedriver", package="chromium-driver"),
        tmp_path_factory.mktemp("chromium-profile"),
    ) as driver:
        yield driver
