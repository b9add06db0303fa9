"""The job-queue practice as a library: a fenced PostgreSQL lease store for long tool calls.

Jobs are claimed under a lease and a fencing token, kept by heartbeats, and completed only while
the lease holds; every transition is an ownership event in an outbox written in the same
transaction, and `OutboxRelay` (`splitbrain leases relay`) publishes it to the detector's input.
`Runner` is the worker loop: claim, heartbeat on a thread of its own, call the tool with the
fence, complete while the lease holds. `splitbrain leases migrate` creates the tables.
`FencedDestination` is the other end:
a destination in the same database that refuses a stale fence with a receipt, ordered in the
job's outbox (`detector.leases.http_destination` serves one over HTTP).
"""

from detector.leases.destination import (
    Decision,
    EffectRequest,
    FencedDestination,
    IdempotencyKeyReusedError,
    Receipt,
    UnknownJobError,
)
from detector.leases.errors import (
    JobKeyConflictError,
    LeaseError,
    LeaseInputError,
    MigrationError,
    StoreUnavailableError,
)
from detector.leases.policy import JobClass, Labels
from detector.leases.relay import OutboxRelay
from detector.leases.retention import Pruned
from detector.leases.runner import Execution, Runner, Status, ToolCall, ToolFailed
from detector.leases.schema import migrate
from detector.leases.store import (
    FailureReason,
    Job,
    JobState,
    Lease,
    LeaseLost,
    LeaseStore,
    LostReason,
    Outcome,
    Stage,
)

__all__ = [
    "Decision",
    "EffectRequest",
    "Execution",
    "FailureReason",
    "FencedDestination",
    "IdempotencyKeyReusedError",
    "Job",
    "JobClass",
    "JobKeyConflictError",
    "JobState",
    "Labels",
    "Lease",
    "LeaseError",
    "LeaseInputError",
    "LeaseLost",
    "LeaseStore",
    "LostReason",
    "MigrationError",
    "OutboxRelay",
    "Outcome",
    "Pruned",
    "Receipt",
    "Runner",
    "Stage",
    "Status",
    "StoreUnavailableError",
    "ToolCall",
    "ToolFailed",
    "UnknownJobError",
    "migrate",
]
