"""Every test in this directory talks to a real local broker: mark them `kafka`."""

from pathlib import Path

import pytest

from tests.conftest import mark_directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_directory(items, Path(__file__).resolve().parent, pytest.mark.kafka)
