"""Inside Temporal's workflow sandbox, `import detector` gives the worker's own modules.

The sandbox imports a workflow's file afresh for every workflow run, and with it every module
that file imports unless it is passed through. A fresh `detector` would cost every run about
0.3 s (pydantic), fail the worker on prometheus_client's restricted imports, and hold an
ownership context of its own that the Temporal adapter's interceptor never sets, so effect calls
in workflow code would send nothing. Nothing in this package is workflow logic: passing it
through is what Temporal advises for such modules, and this does it without the user configuring
the sandbox. `detector/__init__.py` imports this module first; outside a sandbox it does nothing.
It imports nothing of Temporal: it looks for the SDK among the modules already loaded.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from types import ModuleType

PACKAGE = "detector"


def _sandboxed_workflow() -> ModuleType | None:
    """`temporalio.workflow` when this import runs in a sandbox's own module table."""
    workflow = sys.modules.get("temporalio.workflow")
    if workflow is None or not workflow.unsafe.in_sandbox():
        return None
    if workflow.unsafe.is_imports_passed_through():  # the worker's own import, made from it
        return None
    return workflow


def _submodules(package: ModuleType, into: MutableMapping[str, ModuleType]) -> None:
    """Every loaded module of `package`'s tree, reached through the attributes that the import
    system sets on each parent."""
    prefix = package.__name__ + "."
    for value in list(vars(package).values()):
        if (
            isinstance(value, ModuleType)
            and value.__name__.startswith(prefix)
            and into.get(value.__name__) is not value
        ):
            into[value.__name__] = value
            _submodules(value, into)


def pass_through(package: str = PACKAGE) -> None:
    """In a sandbox: replace the sandbox's half-made copy of `package` (being imported now) and
    its submodules with the worker's own; the import then returns the worker's package."""
    workflow = _sandboxed_workflow()
    if workflow is None:
        return
    modules = sys.modules
    own = modules.pop(package)
    try:
        with workflow.unsafe.imports_passed_through():
            host = __import__(package)  # the sandbox's importer: from outside the sandbox
        modules[package] = host
        _submodules(host, modules)
    except BaseException:
        modules[package] = own  # the sandbox imports its own copy, as it would without this
        raise


pass_through()
