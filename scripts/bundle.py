#!/usr/bin/env python3
"""Copy the repository's top-level files the commands ship into `detector/bundled/`.

The top-level directories are the source (DESIGN names them); the package carries a copy, file
for file, so that it reads them the same way from a checkout and from the wheel.
`tests/unit/test_bundled.py` fails when the copy drifts: run `make bundle` (this script).

python scripts/bundle.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

from detector import bundled

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(bundled.__file__).resolve().parent


def main() -> None:
    for name in bundled.SOURCES:
        target = PACKAGE / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        print(f"{ROOT / name} -> {target}")


if __name__ == "__main__":
    main()
