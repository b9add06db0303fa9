"""The detection rules: pure, deterministic, no I/O. The same engine runs everywhere."""

from ._engine import Config, Counters, Detector, FindingUpdate
from ._lease import LeaseHealth, LeaseWarning, ToolClassHealth
from ._state import WorkflowState, decode_state, encode_state

__all__ = [
    "Config",
    "Counters",
    "Detector",
    "FindingUpdate",
    "LeaseHealth",
    "LeaseWarning",
    "ToolClassHealth",
    "WorkflowState",
    "decode_state",
    "encode_state",
]
