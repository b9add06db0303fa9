"""The lease store's errors. A lost lease or a refused result is not one of them: those are
answers (`LeaseLost`, `Outcome.REJECTED`), which a worker acts on rather than retries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from detector.errors import ExitCode, SplitbrainError

if TYPE_CHECKING:
    from detector.leases.store import Job


class LeaseError(SplitbrainError):
    """Every error the lease store raises on purpose; a command that stops on one could not use
    the store."""

    exit_code = ExitCode.UNUSABLE


class LeaseInputError(LeaseError, ValueError):
    """A caller's value the store refuses, naming the field: an unknown job class, an oversized
    payload, an idempotency key or owner id out of bounds. Nothing was written."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class JobKeyConflictError(LeaseInputError):
    """The idempotency key already names a job of another class or payload: the key names one
    operation, and this is a different one. Nothing was written."""

    def __init__(self, existing: Job, job_class: str, payload_sha256: str) -> None:
        super().__init__(
            "idempotency_key",
            f"already names job {existing.id} of class {existing.job_class!r} with another "
            f"class or payload (asked: class {job_class!r}, payload_sha256={payload_sha256})",
        )
        self.existing = existing


class StoreUnavailableError(LeaseError):
    """The database did not answer, or the connection broke mid-call. For a transition, whether
    it committed is unknown: the caller's ownership is uncertain, not lost."""


class MigrationError(LeaseError):
    """The database's schema is not one this version can migrate: it was migrated by a newer
    version, or a step it recorded differs from this version's."""
