"""`temporal-workflow`: workflow code on three workers mailing a receipt per step, each step a
slow workflow task. A worker stopped or cut off inside a task past the 3 s workflow task timeout
loses the run: the server times the task out and another worker replays the run and mails the
step again; the first, woken, mails it too (its completion refused).

The effects are those the adapter reports from workflow code, carrying the run's key, the epoch
(the history length when the run went live on the worker) and `seq` (the history length). Ground
truth: the run's history (`fetch_history`), read around each receipt: the task that mails it
still owns the run unless the history shows that task (by its started event) timed out or failed,
or the run closed. Ordered by `seq`, the receipt the worker's word: `medium` confidence.
"""

from __future__ import annotations

from detector.testing.campaign.checker import Grade
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.sources._temporal import BLIND, TemporalSource


def source() -> TemporalSource:
    return TemporalSource(
        name="temporal-workflow",
        role="workflow",
        workflow="campaign-receipts",
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
            Fault.PAUSE_PAST_LEASE: (4.0, 7.0),  # past the 3 s workflow task timeout
            Fault.PARTITION: (4.0, 7.0),
            Fault.CRASH_RESTART: (1.0, 3.0),
            Fault.GRACEFUL_SHUTDOWN: (1.0, 3.0),
            Fault.EXCEPTION_RETRY: (1.0, 3.0),
            Fault.CLOCK_STEP: (-3.0, 3.0),  # hours
        },
        grade=Grade(ordering="authoritative_seq", destination_confirms=False),
        blind=BLIND,
        units=18,  # two slow tasks each: the workers are busy most of the run
    )
