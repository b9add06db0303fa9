"""The files the commands read and users install, shipped inside the package.

The repository's top-level `topics/`, `alerts/`, `dashboards/` and `examples/` are the source;
this package holds a copy of each (`make bundle` writes it, `tests/unit/test_bundled.py` fails
when it drifts), so that every way the code runs (a checkout, an editable install, the wheel, the
image) reads them the same way, through `importlib.resources`, from any working directory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Final

# The repository's directories this package mirrors, file for file.
SOURCES: Final = ("topics", "alerts", "dashboards", "examples")

TOPICS: Final = PurePosixPath("topics/topics.yaml")
SCHEMAS: Final = PurePosixPath("topics/schemas")
RULES: Final = PurePosixPath("alerts/splitbrain.rules.yml")
ALERTS: Final = PurePosixPath("alerts")
DASHBOARDS: Final = PurePosixPath("dashboards")
EXAMPLES: Final = PurePosixPath("examples")
ACCEPTANCE_HISTORY: Final = PurePosixPath("examples/export-ledger.jsonl")


def resource(name: PurePosixPath) -> Traversable:
    """A bundled file or directory, by its path in the repository."""
    return files(__name__).joinpath(*name.parts)


def walk(directory: PurePosixPath) -> Iterator[tuple[PurePosixPath, Traversable]]:
    """Each bundled file under `directory`, by its path relative to it, in name order; never
    the bytecode pip compiles beside a bundled example script at install (`__pycache__`)."""

    def below(
        node: Traversable, prefix: PurePosixPath
    ) -> Iterator[tuple[PurePosixPath, Traversable]]:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                if child.name != "__pycache__":
                    yield from below(child, prefix / child.name)
            else:
                yield prefix / child.name, child

    yield from below(resource(directory), PurePosixPath())


@contextlib.contextmanager
def on_disk(name: PurePosixPath) -> Iterator[Path]:
    """A bundled file as a path another program can open, for as long as the block runs."""
    with as_file(resource(name)) as path:
        yield path
