"""Every test in this directory talks to a real local broker: mark them `kafka`."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from detector.testing.kafka import LocalKafka
from tests.conftest import mark_directory
from tests.integration.deployment import RUNTIMES, Deployment


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_directory(items, Path(__file__).resolve().parent, pytest.mark.kafka)


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
