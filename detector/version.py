"""What `splitbrain --version` says: the package's version, whose one source is pyproject.toml
(read from the installed package's metadata), and the versions of what it reads and writes and
an upgrade must keep: the event and finding contracts, the pager's state records, and the
workflow state of the changelog."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Final

from detector.contracts import events, findings, page_state
from detector.core import STATE_VERSION

DISTRIBUTION: Final = "splitbrain-detector"


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a checkout on PYTHONPATH, never installed
        return "unknown (not installed: pip install -e .)"


def describe() -> str:
    return "\n".join(
        (
            f"{DISTRIBUTION} {package_version()}",
            f"events: {events.SCHEMA}",
            f"findings: {findings.SCHEMA}",
            f"page state: {page_state.SCHEMA}",
            f"workflow state: v{STATE_VERSION}",
        )
    )
