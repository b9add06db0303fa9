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
    # More headers after the common ones, such as what an engine error gives to group by.
    details: tuple[tuple[str, str], ...] = ()

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
            *((name, value.encode()) for name, value in self.details),
        ]


# Where an outbox row comes from: the lease store's table, in a dead letter's `source.table`.
OUTBOX_TABLE: Final = "tool_job_outbox"


@dataclass(frozen=True, slots=True)
class OutboxDeadLetter:
    """A row of the lease store's outbox that is not a valid event (written by hand, or by a
    version that did not check what it wrote): the relay sends it to the DLQ topic, keyed by
    its job, instead of stopping at it or dropping it."""

    reason: str
    field: str | None
    job_id: str
    seq: int
    value: bytes

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        return [
            ("error.reason", self.reason.encode()),
            ("error.field", (self.field or "").encode()),
            ("source.table", OUTBOX_TABLE.encode()),
            ("source.job", self.job_id.encode()),
            ("source.seq", str(self.seq).encode()),
        ]
