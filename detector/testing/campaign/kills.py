"""The writes a SIGKILL may have silenced, counted blind rather than missed.

An adapter holds its events in memory for a while before Kafka has them: it sends in batches from
a thread, and while Kafka is down it holds them for the outage. A worker killed meanwhile takes
them along, and no event is left to show its write. Sources whose adapters buffer so declare
`KILLED_UNSENT` and record their kills here; the checker counts such writes apart when no finding
names them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from detector.testing.campaign.nemesis import Fault, Step
from detector.testing.campaign.truth import TruthLog, Write

KILLED_UNSENT: Final = "killed_unsent"
# A write this close before its worker's SIGKILL may have died with its events (one batch).
UNSENT_S: Final = 1.0
WHY: Final = (
    "a worker killed (SIGKILL) within a second of an effect, or while Kafka was down since the "
    "effect: the adapter holds its events in memory until Kafka takes them, so those of the "
    "effect may die with the process unsent (and a later write of the same key is then a "
    "duplicate the events cannot show)"
)


@dataclass
class Kills:
    """Each kill's silenced span, per executor; `kafka_down_since` says when the outage under way
    began (None while Kafka serves)."""

    kafka_down_since: Callable[[], float | None]
    _spans: list[tuple[str, float, float]] = field(default_factory=list)
    _paused: dict[str, tuple[float, float]] = field(default_factory=dict)

    def note(self, executor: str, step: Step) -> None:
        """Before `step` is applied to `executor`: a pause holds its unsent events, a kill drops
        them (back to the pause's start, or the outage's)."""
        now = time.time()
        if step.fault is Fault.PAUSE_PAST_LEASE:
            self._paused[executor] = (now, now + step.hold_s)
        elif step.fault is Fault.CRASH_RESTART:
            since, until = self._paused.get(executor, (now, now))
            held = since if since <= now < until else now
            down = self.kafka_down_since()
            self._spans.append((executor, min(held, down or held) - UNSENT_S, now))

    def mark(self, truth: TruthLog) -> None:
        """Mark the silenced writes, and the duplicates that only they make duplicates, once
        every worker of the run is stopped."""
        if not self._spans:
            return
        marked: list[Write] = []
        heard: dict[tuple[str, str], bool] = {}  # a key's earlier writes: any not silenced?
        for w in sorted(truth.writes(), key=lambda w: w.at):
            key = (w.workflow_key, w.effect_key)
            silenced = any(w.executor == name and a <= w.at <= b for name, a, b in self._spans)
            echo = w.owned and heard.get(key) is False
            blind = (silenced or echo) and w.blind is None
            marked.append(w.model_copy(update={"blind": KILLED_UNSENT}) if blind else w)
            heard[key] = heard.get(key, False) or not silenced
        truth.path.write_text("".join(w.model_dump_json() + "\n" for w in marked))
