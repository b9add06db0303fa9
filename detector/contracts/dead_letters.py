"""DESIGN §7: what a dead letter says about the record it carries, in its headers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Bounded metric labels for dead letters; every reason below starts with one of them.
REASON_CODES: Final = ("too_large", "empty", "key_mismatch", "no_key", "invalid")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record the detector cannot use, and why; it goes to the DLQ topic, never nowhere."""

    reason: str
    field: str | None
    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int

    @property
    def reason_code(self) -> str:
        """A bounded label for metrics: the first words of the reason, not the input."""
        return next((code for code in REASON_CODES if self.reason.startswith(code)), "invalid")

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        return [
            ("error.reason", self.reason.encode()),
            ("error.field", (self.field or "").encode()),
            ("source.topic", self.topic.encode()),
            ("source.partition", str(self.partition).encode()),
            ("source.offset", str(self.offset).encode()),
        ]
