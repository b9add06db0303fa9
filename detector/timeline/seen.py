"""What a timeline is drawn from: the events kept of a finding's workflow, each with its arrival.

Kept apart from the drawing so that what keeps them (`detector.histories.window` while `audit`
reads a history) sits above the picture, not beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from detector.contracts.events import OwnershipEvent


@dataclass(frozen=True, slots=True)
class Seen:
    """An event and its position in the history (its arrival), the order when `seq` is absent."""

    arrival: int
    event: OwnershipEvent


class Windows(Protocol):
    """The events kept of each workflow."""

    def events(self, workflow_key: str) -> tuple[list[Seen], int]:
        """The kept events of `workflow_key` in arrival order, and how many were left out."""
        ...
