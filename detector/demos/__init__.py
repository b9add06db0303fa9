"""The systems `splitbrain demo --source NAME` can show a live zombie in.

The demo's command starts the stack (Kafka, the detector workers, PostgreSQL, Prometheus,
Alertmanager, the pager bridge) and waits for the critical finding and the page; a source only
makes the zombie happen, in its own system, with its adapter emitting to the stack's broker.
The lease store (`leases`, the default) is the demo's own fleet, run by `detector.demos.runner`
with the rest of the demo (the `splitbrain demo` command only parses its flags). Each
other source is a module `detector.demos.<name>` (a `-` in the name is a `_` in the module's)
whose `source()` returns a `DemoSource`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from detector.devstack.components import Component

LEASES: Final = "leases"
SOURCES: Final = (
    *(LEASES, "temporal", "celery", "langgraph", "etcd", "kubernetes"),
    *("redis-lock", "kafka-consumer"),
)


@dataclass(frozen=True, slots=True)
class DemoStack:
    """What a source gets of the running stack."""

    bootstrap_servers: str
    env: Mapping[str, str]  # this environment plus the `SPLITBRAIN_*` variables of the broker
    dsn: str | None  # the stack's PostgreSQL database, when PostgreSQL runs
    logs: Path  # where the source's processes write their logs
    say: Callable[[str], None]  # one line of narration, timestamped
    # Start a process as part of the stack: recorded in stack.json, waited for until ready,
    # stopped with the rest (also by Ctrl-C and `splitbrain dev down`).
    add: Callable[[Component], Component]


class DemoSource(Protocol):
    """One system's zombie, live."""

    name: str

    def missing(self) -> str | None:
        """What this machine lacks to run it, in one line (checked before anything starts)."""
        ...

    def start(self, stack: DemoStack) -> None:
        """Start the system's servers and workers (through `stack.add`) and set the zombie in
        motion; raise `detector.devstack.errors.StackError` if they fail."""
        ...

    def poll(self) -> None:
        """Called about every 50 ms until the verdict: narrate, drive the fault. Never waits."""
        ...

    def stop(self) -> None:
        """Release what `start` holds besides the stack's processes (clients, connections)."""
        ...


class _Unavailable:
    """A source this version does not have."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self._why = why

    def missing(self) -> str | None:
        return self._why

    def start(self, stack: DemoStack) -> None:
        raise AssertionError("an unavailable source is never started")

    def poll(self) -> None:
        return None

    def stop(self) -> None:
        return None


def load(name: str) -> DemoSource:
    """The source `name` (one of `SOURCES` but `leases`)."""
    module_name = f"{__name__}.{name.replace('-', '_')}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return _Unavailable(name, f"the {name} demo is not in this version")
        return _Unavailable(
            name,
            f"the {name} demo needs Python package {exc.name!r}: "
            f"pip install 'splitbrain-detector[{name}]'",
        )
    source: DemoSource = module.source()
    return source
