"""The engine builds its records the fast way; they must equal the named constructor's."""

from __future__ import annotations

from detector.contracts.findings import ConditionKind
from detector.core._records import AcquisitionRecord, ConditionRecord, EventRecord, new_record


def test_the_fast_constructor_builds_the_same_records() -> None:
    ctx = (("task", "myapp.add"), ("attempt", "2"))
    event = ("e1", "heartbeat", 3, 7, 2, "worker", None, "w1", 1.5, None, ctx)
    acquisition = (4, 9, 3, "a4", "w2", None, ctx)
    condition = (
        ConditionKind.DUPLICATE_EFFECT,
        "c9",
        9,
        5,
        "k",
        "failover",
        (3, 4),
        "destination",
        None,
        ("w1", "w2"),
        True,
    )
    for record, values in (
        (EventRecord, event),
        (AcquisitionRecord, acquisition),
        (ConditionRecord, condition),
    ):
        fast = new_record(record, values)
        assert fast == record(*values)
        assert type(fast) is record
        assert fast._asdict() == record(*values)._asdict()
