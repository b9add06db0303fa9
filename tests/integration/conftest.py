"""The integration tests' servers and deployments (tests/conftest.py marks them by cost)."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.devstack.kafka import LocalKafka
from detector.devstack.postgres import LocalPostgres
from detector.leases import migrate
from detector.leases.db import connect
from tests.integration.deployment import RUNTIMES, Deployment


def deploy(broker: LocalKafka, workdir: Path, variant: str) -> Deployment:
    """`variant` is a runtime, or `runtime-store`."""
    runtime, _, store = variant.partition("-")
    if runtime == "faust":
        pytest.importorskip("faust", reason="the faust extra is not installed (.[faust])")
    return Deployment(broker, workdir, runtime, store or "memory")


@pytest.fixture(params=RUNTIMES)
def deployment(
    request: pytest.FixtureRequest, kafka_broker: LocalKafka, tmp_path: Path
) -> Iterator[Deployment]:
    """Fresh topics, and the workers the test starts on them, of each runtime in turn (a test
    can parametrize it indirectly with `runtime-store` variants)."""
    d = deploy(kafka_broker, tmp_path, request.param)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """One PostgreSQL server for the session (`.dsn`, `.restart()`), stopped by PID at the end;
    a test that restarts it leaves it running."""
    with LocalPostgres() as server:
        yield server


@pytest.fixture(scope="session")
def lease_store_template(postgres: LocalPostgres) -> str:
    """A database migrated to the lease store's schema once per session, that each test's
    database copies: a copy costs less than a migration."""
    name = "lease_store_template"
    with connect(postgres.create_database(name)) as conn:
        migrate(conn)
    return name


def _database(postgres: LocalPostgres, template: str | None) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex}"
    dsn = postgres.create_database(name, template=template)
    try:
        yield dsn
    finally:
        postgres.drop_database(name)


@pytest.fixture
def postgres_dsn(postgres: LocalPostgres, lease_store_template: str) -> Iterator[str]:
    """A new database of the session's server for this test alone, already migrated to the
    lease store's schema, dropped after it."""
    yield from _database(postgres, lease_store_template)


@pytest.fixture
def empty_postgres_dsn(postgres: LocalPostgres) -> Iterator[str]:
    """A new, empty database for this test alone (the tests of migrating one), dropped after it."""
    yield from _database(postgres, None)


@pytest.fixture
def db(postgres_dsn: str) -> Iterator[psycopg.Connection[DictRow]]:
    """A connection to the test's database, for the test's own reads."""
    with connect(postgres_dsn) as conn:
        yield conn


@pytest.fixture
def kafka_deployment(kafka_broker: LocalKafka, tmp_path: Path) -> Iterator[Deployment]:
    """Fresh topics and the kafka runtime's workers alone: for what is not about the runtime
    (the adapters, the lease store's cancel)."""
    d = deploy(kafka_broker, tmp_path, "kafka")
    try:
        yield d
    finally:
        d.close()
