"""The package's layers: the import contracts in pyproject.toml's `[tool.importlinter]` (the
tiers, `detector.testing` imported by no module outside it, a pure `detector.core`), checked by
import-linter here so that the README's test command and CI enforce them."""

from __future__ import annotations

from importlinter import configuration
from importlinter.application.use_cases import lint_imports

from tests.paths import ROOT


def test_the_import_contracts_hold() -> None:
    """On failure, import-linter's report (the captured output) names each import that breaks
    a contract."""
    configuration.configure()
    config = str(ROOT / "pyproject.toml")
    assert lint_imports(config_filename=config, cache_dir=None, no_logo=True)
