"""The public API, pinned: a name added to or removed from `__all__` is a decision, made here too.

`detector` is what a library user imports (README "The engine as a library"); `detector.core` is
the engine's facade, the only way into the rules; `detector.leases` is the job-queue practice a
team adopts (README "Adopting the lease store"). Change these lists with the API, and say so in
CHANGELOG.md.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "detector": [
        "Condition",
        "ConditionKind",
        "Config",
        "Detector",
        "EventError",
        "Finding",
        "FindingUpdate",
        "Kind",
        "OwnershipEvent",
        "Severity",
        "Source",
        "Status",
        "parse_event_json",
    ],
    "detector.core": [
        "STATE_VERSION",
        "Advanced",
        "Bound",
        "Config",
        "Counters",
        "Detector",
        "FindingStats",
        "FindingUpdate",
        "LabelBounds",
        "LeaseHealth",
        "LeaseStats",
        "LeaseWarning",
        "Observations",
        "SweepMarks",
        "SweptStates",
        "WorkflowState",
        "decode_state",
        "encode_state",
        "sweep_marks",
    ],
    "detector.leases": [
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
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_the_pinned_public_api(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    assert len(set(mod.__all__)) == len(mod.__all__)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_there(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []


def test_the_package_reexports_the_engine_it_names() -> None:
    import detector  # noqa: PLC0415
    import detector.core  # noqa: PLC0415

    for name in set(detector.__all__) & set(detector.core.__all__):
        assert getattr(detector, name) is getattr(detector.core, name)
