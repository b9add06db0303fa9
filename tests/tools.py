"""External programs some tests run: promtool, Prometheus, Alertmanager, chromium.

Without one, its tests skip and say what to install. `.ci/run` installs them and sets
SPLITBRAIN_REQUIRE_TOOLS=1, under which tests/conftest.py turns every skip into a failure: in CI
a rules file nobody checked is worse than none.
"""

from __future__ import annotations

import shutil

import pytest


def program(*names: str, package: str) -> str:
    """The path of the first of `names` on PATH; else skip, saying which Debian `package`
    provides it."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(
        f"{' or '.join(names)} is not on PATH: install Debian's {package} package "
        f"(apt-get update && apt-get install -y {package})"
    )
