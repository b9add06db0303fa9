"""The package's layers, read from the source: every `import` of every module under detector/
(those inside functions and under TYPE_CHECKING too) goes to its own package or one below it,
and `detector.testing` (test doubles, the torture harness) is imported by no module outside it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tests.paths import ROOT

PACKAGE: Final = ROOT / "detector"

# Bottom first. A package (or top-level module) of detector/ imports only from its own tier and
# the tiers before it; within a tier, packages do not import each other.
TIERS: Final = (
    ("errors", "closing", "backoff", "bundled", "gc_tuning", "_sandbox"),
    ("contracts", "settings"),
    ("core", "report"),
    ("version", "kafka"),
    ("leases", "paging", "timeline", "telemetry"),
    ("histories", "adapters", "view", "runtime"),
    ("devstack",),  # the servers the product's own `demo` and `dev` run
    ("demos",),  # the demo's run and its sources, on the dev stack
    ("cli",),
    ("testing",),  # fixtures, doubles and the torture harness: on top, imported by none
)
RANK: Final = {name: rank for rank, tier in enumerate(TIERS) for name in tier}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[str]:
    """The detector modules `path` imports, by absolute name (`from detector import bundled` is
    `detector.bundled`; relative imports resolved)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def layer(module: str) -> str | None:
    """The package or top-level module of detector/ that `module` is in (None: not detector's,
    or the package's face, `detector` itself)."""
    parts = module.split(".")
    if parts[0] != "detector" or len(parts) < 2:
        return None
    known = (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").exists()
    return parts[1] if known else None


BUNDLED_EXAMPLES: Final = PACKAGE / "bundled" / "examples"


def edges() -> set[tuple[str, str, str]]:
    """(importing layer, imported layer, importing module) for every import across layers."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(BUNDLED_EXAMPLES):  # files for users to copy, never imported
            continue
        source = layer(module_name(path))
        if source is None:  # detector/__init__.py, the public face: above every layer
            continue
        for target in filter(None, map(layer, imported(path))):
            if target != source:
                found.add((source, target, module_name(path)))
    return found


def test_every_layer_of_the_package_is_in_one_tier() -> None:
    layers = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or any(p.glob("*.py"))}
    assert layers - {"__init__"} == set(RANK)
    assert len(RANK) == sum(len(tier) for tier in TIERS)


def test_no_module_outside_testing_imports_it() -> None:
    assert sorted(m for source, target, m in edges() if target == "testing") == []


def test_no_package_imports_one_above_it_or_beside_it() -> None:
    wrong = sorted(
        f"{module} ({source}) imports {target}"
        for source, target, module in edges()
        if RANK[target] >= RANK[source]
    )
    assert wrong == []


def test_imports_inside_functions_are_read() -> None:
    """`splitbrain demo` imports its run only when it runs: that import counts too."""
    assert "detector.demos.runner.play" in set(imported(PACKAGE / "cli" / "demo.py"))
