"""The package installs beside what a worker environment already has: pyproject.toml bounds each
dependency from below, at the version the suite runs with, which constraints.txt pins for `make`,
CI and the image. A pin raised without its bound (or a bound without its pin) fails here."""

from __future__ import annotations

import re
import tomllib
from typing import Final

from tests.paths import ROOT

_LOWER_BOUND: Final = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]+\])?>=(?P<v>[^,;\s]+)"
)
_PIN: Final = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<v>\S+)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def test_every_requirement_has_a_lower_bound_and_no_pin() -> None:
    for extra, lines in requirements().items():
        for line in lines:
            assert _LOWER_BOUND.fullmatch(line), f"[{extra}] {line}: not NAME>=VERSION"


def test_constraints_pin_each_requirement_at_its_lower_bound() -> None:
    bounds = {}
    for lines in requirements().values():
        for line in lines:
            match = _LOWER_BOUND.fullmatch(line)
            assert match is not None, line
            bounds[_normal(match["name"])] = match["v"]
    pins = {}
    for text in (ROOT / "constraints.txt").read_text().splitlines():
        line = text.partition("#")[0].strip()
        if line:
            match = _PIN.fullmatch(line)
            assert match is not None, f"constraints.txt: {text}: not NAME==VERSION"
            pins[_normal(match["name"])] = match["v"]
    assert pins == bounds
