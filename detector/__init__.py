"""splitbrain: detect displaced owners of leased workflows that are still acting."""

import detector._sandbox  # noqa: F401  (first: Temporal's workflow sandbox gets these modules)
from detector.contracts.events import EventError, Kind, OwnershipEvent, Source, parse_event_json
from detector.contracts.findings import Condition, ConditionKind, Finding, Severity, Status
from detector.core import Config, Detector, FindingUpdate

__all__ = [
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
]
