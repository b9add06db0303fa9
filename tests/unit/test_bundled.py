"""The package carries the repository's topics, schemas, alerts, dashboards and examples as they
are at the top level, the source: a change made there alone fails here until `make bundle`."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from detector import bundled
from tests.paths import ROOT


def repository_files(name: str) -> dict[PurePosixPath, bytes]:
    top = ROOT / name
    return {
        PurePosixPath(path.relative_to(top).as_posix()): path.read_bytes()
        for path in top.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.mark.parametrize("name", bundled.SOURCES)
def test_the_package_carries_the_repository_files_unchanged(name: str) -> None:
    shipped = {path: node.read_bytes() for path, node in bundled.walk(PurePosixPath(name))}
    source = repository_files(name)
    assert sorted(shipped) == sorted(source), f"detector/bundled/{name} drifted: run `make bundle`"
    changed = sorted(str(path) for path in source if shipped[path] != source[path])
    assert not changed, f"detector/bundled/{name}: {changed} differ: run `make bundle`"


def test_the_named_files_are_bundled() -> None:
    for name in (bundled.TOPICS, bundled.RULES, bundled.ACCEPTANCE_HISTORY):
        assert bundled.resource(name).is_file(), name
    for directory in (bundled.SCHEMAS, bundled.ALERTS, bundled.DASHBOARDS, bundled.EXAMPLES):
        assert any(bundled.walk(directory)), directory
