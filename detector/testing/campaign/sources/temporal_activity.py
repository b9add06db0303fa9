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
from detector.testing.campaign.sources._temporal import BLIND, FAULTS, TemporalSource, holds


def source() -> TemporalSource:
    return TemporalSource(
        name="temporal-activity",
        role="activity",
        workflow="campaign-order",
        faults=FAULTS,
        holds=holds(past_lease=(3.0, 6.0)),  # past the 2 s heartbeat timeout
        grade=Grade(ordering="arrival", destination_confirms=False),
        blind=BLIND,
        units=36,
    )
