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
from detector.testing.campaign.sources._temporal import BLIND, FAULTS, TemporalSource, holds


def source() -> TemporalSource:
    return TemporalSource(
        name="temporal-workflow",
        role="workflow",
        workflow="campaign-receipts",
        faults=FAULTS,
        holds=holds(past_lease=(4.0, 7.0)),  # past the 3 s workflow task timeout
        grade=Grade(ordering="authoritative_seq", destination_confirms=False),
        blind=BLIND,
        units=18,  # two slow tasks each: the workers are busy most of the run
    )
