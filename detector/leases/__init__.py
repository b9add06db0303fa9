"""The job-queue practice as a library: a fenced PostgreSQL lease store for long tool calls.

Jobs are claimed under a lease and a fencing token, kept by heartbeats, and completed only while
the lease holds; every transition is an ownership event in an outbox written in the same
transaction. `splitbrain leases migrate` creates the tables.
"""

from detector.leases.errors import (
    LeaseError,
    LeaseInputError,
    MigrationError,
    StoreUnavailableError,
)
from detector.leases.policy import JobClass, Labels
from detector.leases.schema import migrate
from detector.leases.store import (
    FailureReason,
    Job,
    JobState,
    Lease,
    LeaseLost,
    LeaseStore,
    Outcome,
)

__all__ = [
    "FailureReason",
    "Job",
    "JobClass",
    "JobState",
    "Labels",
    "Lease",
    "LeaseError",
    "LeaseInputError",
    "LeaseLost",
    "LeaseStore",
    "MigrationError",
    "Outcome",
    "StoreUnavailableError",
    "migrate",
]
