"""The detection rules: pure, deterministic, no I/O. The same engine runs everywhere.

An event's way through the engine, one module per job:
- `_engine`: `Detector`, which holds the workflows' states and hands each job to its part;
- `_intake`: taking an event in (redeliveries, acquisitions, lease events), the hot path;
- `_retention`: the caps that bound a workflow's memory, and what each one cut;
- `_conditions`: what an event adds to its episodes, a stale event's condition or a duplicate;
- `_takeover`: late acquisitions, what they displace and which findings they may rename;
- `_silence`: signs of life, which restart a displaced owner's quiet period;
- `_settling`: episodes settled into finding revisions, published only when changed;
- `_deadlines`: when time alone may settle a workflow's findings, for `Detector.advance`;
- `_rules`, `_records`, `_episode`, `_state`, `_render`: the order of events, their records,
  an episode's conditions, the state and its encoding, and the finding document;
- `_lease`, `_labels`: lease health; `_clock`: the times `audit` believes; `_reach`: a
  two-sided index; `_context`: a finding's context; `_upgrade`: older state versions;
- `_config`, `_counts`: the engine's settings and what it counts for metrics.
"""

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
