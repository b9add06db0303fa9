"""The torture run needs a broker of its own (it kills and pauses it): mark it `kafka`."""

from pathlib import Path

import pytest

from tests.conftest import mark_directory


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_directory(items, Path(__file__).resolve().parent, pytest.mark.kafka, pytest.mark.torture)
