"""`temporal-activity`: heartbeating activities on three workers, each charging its order at the
end. A worker stopped, cut off or slow past the 2 s heartbeat timeout loses its attempt: the
server gives the activity to attempt 2 (on another worker, or on the stopped worker's own open
poll), and the first attempt, woken, charges the order too.

Ground truth: the activity's current attempt as the server describes it (`describe()`'s pending
activities), read around each charge (`temporal_worker`). Its events carry no `seq` (ordered by
arrival) and the charge is the worker's word: findings are `low` confidence.
"""

from __future__ import annotations

from detector.testing.campaign.checker import Grade
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.sources._temporal import BLIND, TemporalSource


def source() -> TemporalSource:
    return TemporalSource(
        name="temporal-activity",
        role="activity",
        workflow="campaign-order",
        faults=frozenset(
            {
                Fault.PAUSE_PAST_LEASE,
                Fault.CRASH_RESTART,
                Fault.GRACEFUL_SHUTDOWN,
                Fault.EXCEPTION_RETRY,
                Fault.PARTITION,
                Fault.CLOCK_STEP,
            }
        ),
        holds={
            Fault.PAUSE_PAST_LEASE: (3.0, 6.0),  # past the 2 s heartbeat timeout
            Fault.PARTITION: (3.0, 6.0),
            Fault.CRASH_RESTART: (1.0, 3.0),
            Fault.GRACEFUL_SHUTDOWN: (1.0, 3.0),
            Fault.EXCEPTION_RETRY: (1.0, 3.0),
            Fault.CLOCK_STEP: (-3.0, 3.0),  # hours
        },
        grade=Grade(ordering="arrival", destination_confirms=False),
        blind=BLIND,
        units=36,
    )
