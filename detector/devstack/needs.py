"""The line a demo or a campaign source gives when this machine lacks a Python package, Debian's
`redis-server` or a server's program: said once, so that a demo and the campaign name the same
install."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable

from detector.errors import SplitbrainError


def missing_package(extra: str, *modules: str) -> str | None:
    """The first of `modules` that is not installed, with the extra that brings it; None when
    all are."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"needs Python package {module!r}: pip install 'splitbrain-detector[{extra}]'"
    return None


def missing_redis_server() -> str | None:
    """What to install when `redis-server` is not on the PATH; None when it is."""
    if shutil.which("redis-server") is None:
        return "needs Debian's redis-server: apt-get install --no-install-recommends redis-server"
    return None


def missing_program(what: str, find: Callable[[], object]) -> str | None:
    """What to install when `find`, a starter's lookup of its program (`etcd_binary`,
    `postgres_binaries`...), raises the error that says so; None when it finds it."""
    try:
        find()
    except SplitbrainError as exc:
        return f"needs {what}: {exc}"
    return None
