"""The findings the view shows: the latest revision of each and every revision seen before it.

The reader's thread adds, the server's requests read: each read takes a consistent copy under a
lock, so a page never mixes two moments of the topic.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Message

from detector.contracts.findings import Finding, Severity, Status
from detector.kafka.findings import FindingsView


@dataclass(frozen=True, slots=True)
class Filters:
    """The list's query: each None shows all; `workflow` matches part of the workflow key."""

    severity: Severity | None = None
    status: Status | None = None
    workflow: str | None = None

    def match(self, f: Finding) -> bool:
        return (
            (self.severity is None or f.severity == self.severity)
            and (self.status is None or f.status == self.status)
            and (not self.workflow or self.workflow in f.workflow_key)
        )


def listed(findings: Iterable[Finding], filters: Filters) -> list[Finding]:
    """Open findings first, then the worst, then by workflow key."""
    return sorted(
        (f for f in findings if filters.match(f)),
        key=lambda f: (f.status != Status.OPEN, -f.severity.rank, f.workflow_key, f.finding_id),
    )


class FindingsStore(FindingsView):
    """`tail`'s view of the topic, with each finding's revisions kept as they arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.revisions: dict[str, list[Finding]] = {}
        self.caught_up = False  # every partition was read to its end once
        self.failure: str | None = None  # why the reader stopped, if it did
        self._lock = threading.Lock()

    def add(self, msg: Message) -> Finding | None:
        with self._lock:
            finding = super().add(msg)
            if finding is not None:
                self.revisions.setdefault(finding.finding_id, []).append(finding)
            return finding

    def latest(self) -> list[Finding]:
        with self._lock:
            return list(self.findings.values())

    def history(self, finding_id: str) -> list[Finding]:
        """Every revision of one finding, oldest first; empty when the topic has none."""
        with self._lock:
            return list(self.revisions.get(finding_id, ()))
