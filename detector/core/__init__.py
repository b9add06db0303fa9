"""The detection rules: pure, deterministic, no I/O. The same engine runs everywhere."""

from ._engine import Advanced, Config, Counters, Detector, FindingUpdate
from ._lease import LeaseHealth, LeaseWarning, ToolClassHealth
from ._state import WorkflowState, encode_state
from ._upgrade import decode_state

__all__ = [
    "Advanced",
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
