"""The detection rules: pure, deterministic, no I/O. The same engine runs everywhere."""

from ._config import Bound, Config
from ._counts import Counters, FindingStats, Observations
from ._engine import Advanced, Detector, SweptStates
from ._labels import LabelBounds
from ._lease import LeaseHealth, LeaseStats, LeaseWarning
from ._settling import FindingUpdate
from ._state import STATE_VERSION, WorkflowState, encode_state
from ._upgrade import SweepMarks, decode_state, sweep_marks

__all__ = [
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
]
