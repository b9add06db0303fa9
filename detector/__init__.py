"""splitbrain: detect displaced owners of leased workflows that are still acting."""

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
