"""The events a report draws around each episode, kept while a history is audited.

The engine keeps what the rules need, not what a person wants to see, so the report keeps its
own window: per workflow a short ring of the latest events and, once the workflow has produced a
finding update, those events, the next few, and every later fence, acquisition and verification,
up to a bound. Memory is bounded per workflow; `retain` drops the workflows without findings.

Events are kept as their lines, not as parsed events: a line is a fifth of the memory of its
event, and only the few drawn are parsed again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from detector.contracts.events import Kind, OwnershipEvent
from detector.histories.reader import UTF8_BOM, GoodLine, parse_line
from detector.timeline.seen import Seen

# Kinds that open or close an episode: worth keeping after the window around an update ended.
LANDMARKS: Final = frozenset(
    {
        Kind.LEASE_ACQUIRED,
        Kind.LEASE_LOST,
        Kind.LEASE_RELEASED,
        Kind.EFFECT_REJECTED,
        Kind.OUTCOME_VERIFIED,
    }
)


@dataclass(slots=True)
class _Workflow:
    recent: deque[tuple[int, bytes]]  # (arrival, line)
    kept: dict[int, bytes] | None = None  # by arrival; None until the workflow has an update
    after: int = 0  # events still to keep after the latest update
    left_out: int = 0  # events not kept once `limit` was reached


@dataclass(slots=True)
class EventWindows:
    """Feed it every event (`add`), and `mark` the workflow of an event that updated a finding."""

    before: int = 16
    after: int = 16
    limit: int = 400
    _workflows: dict[str, _Workflow] = field(default_factory=dict)
    _line: bytes = b""

    def reading(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        """`lines`, remembering the latest: the line of the event `add` is given next."""
        for line in lines:
            self._line = line
            yield line

    def add(self, arrival: int, event: OwnershipEvent) -> None:
        """`event`, read from the latest line `reading` passed on."""
        wf = self._workflows.get(event.workflow_key)
        if wf is None:
            wf = self._workflows[event.workflow_key] = _Workflow(deque(maxlen=self.before))
        line = self._line.removeprefix(UTF8_BOM).rstrip(b"\r\n")
        wf.recent.append((arrival, line))
        if wf.kept is not None and (wf.after > 0 or event.kind in LANDMARKS):
            wf.after = max(wf.after - 1, 0)
            self._keep(wf, arrival, line)

    def mark(self, workflow_key: str) -> None:
        """The latest event of `workflow_key` updated a finding: keep what led to it and what
        follows."""
        wf = self._workflows[workflow_key]
        if wf.kept is None:
            wf.kept = {}
        for arrival, line in wf.recent:
            self._keep(wf, arrival, line)
        wf.after = self.after

    def _keep(self, wf: _Workflow, arrival: int, line: bytes) -> None:
        assert wf.kept is not None
        if arrival in wf.kept:
            return
        if len(wf.kept) >= self.limit:
            wf.left_out += 1
            return
        wf.kept[arrival] = line

    def retain(self, workflow_keys: set[str]) -> None:
        """Forget every workflow not in `workflow_keys` (those without findings)."""
        for key in [k for k in self._workflows if k not in workflow_keys]:
            del self._workflows[key]

    def events(self, workflow_key: str) -> tuple[list[Seen], int]:
        """The kept events of a workflow in arrival order, and how many the bound left out."""
        wf = self._workflows.get(workflow_key)
        if wf is None or wf.kept is None:
            return [], 0
        seen = []
        for arrival in sorted(wf.kept):
            item = parse_line(arrival, wf.kept[arrival])
            if isinstance(item, GoodLine):  # it was read as this event once
                seen.append(Seen(arrival, item.event))
        return seen, wf.left_out
