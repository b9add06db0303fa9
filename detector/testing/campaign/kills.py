"""The writes a worker's exit may have silenced, counted blind rather than missed.

An adapter holds its events in memory for a while before Kafka has them: it sends in batches from
a thread, and while Kafka is down it holds them for the outage. A worker killed meanwhile takes
them along (`KILLED_UNSENT`). One shut down gracefully flushes them at exit, but only within a
bound (`SPLITBRAIN_ADAPTER_EXIT_FLUSH_S`): when Kafka stays down past it, they are counted as
dropped and logged, and lost (`SHUTDOWN_UNSENT`). Sources whose adapters buffer so declare these
codes and record their exits here; the checker counts such writes apart when no finding names
them.

An exit is noted under the process's name in the fleet. A write is that process's when it says
so (`Write.process`: the etcd and Kubernetes workers, whose executor is a lease or an identity
each start takes anew), else when its executor is that name (the other sources' workers keep
their executor across restarts).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from detector.adapters._sink import DEFAULT_EXIT_FLUSH_S
from detector.testing.campaign.nemesis import Fault, Step
from detector.testing.campaign.source import KafkaOutages
from detector.testing.campaign.truth import KILLED_UNSENT, SHUTDOWN_UNSENT, TruthLog, Write

# A write this close before its worker's SIGKILL may have died with its events (one batch).
UNSENT_S: Final = 1.0
_HEARD: Final = ""
WHY: Final = {
    KILLED_UNSENT: (
        "a worker killed (SIGKILL) within a second of an effect, or while Kafka was down since the "
        "effect: the adapter holds its events in memory until Kafka takes them, so those of the "
        "effect may die with the process unsent (and a later write of the same key is then a "
        "duplicate the events cannot show)"
    ),
    SHUTDOWN_UNSENT: (
        "a worker shut down while Kafka was down for longer than the adapter's exit flush "
        f"({DEFAULT_EXIT_FLUSH_S:g} s): the events it still held are counted as dropped "
        "(`splitbrain_adapter_events_dropped_total`, reason exit) and logged, and never arrive"
    ),
}


# process, kill or shutdown, held since, signalled at, gone at
_Exit = tuple[str, Fault, float, float, float]
_Span = tuple[str, str, float, float]  # process, blind code, from, to


@dataclass
class Kills:
    """Each exit of a worker by the nemesis, to mark what it silenced once the run is over."""

    outages: KafkaOutages
    _exits: list[_Exit] = field(default_factory=list)
    _paused: dict[str, tuple[float, float]] = field(default_factory=dict)

    def note(self, process: str, step: Step) -> None:
        """Before `step` is applied to `process`: a pause holds its unsent events (from the
        pause's start), a kill or a shutdown ends it (`exiting`, which knows when it is gone)."""
        now = time.time()
        if step.fault is Fault.PAUSE_PAST_LEASE:
            self._paused[process] = (now, now + step.hold_s)
        elif step.fault in (Fault.CRASH_RESTART, Fault.GRACEFUL_SHUTDOWN):
            since, until = self._paused.get(process, (now, now))
            held = since if since <= now < until else now
            self._exits.append((process, step.fault, held, now, now))

    @contextlib.contextmanager
    def exiting(self, process: str, step: Step) -> Iterator[None]:
        """Around applying `step` to `process`, which returns once a kill or a shutdown has
        ended it: a graceful shutdown first finishes its running task (whose write comes after
        the signal) and then flushes, so what it lost depends on when it was gone."""
        before = len(self._exits)
        self.note(process, step)
        yield
        if len(self._exits) > before:
            self._exits[before] = (*self._exits[before][:4], time.time())

    def resumed(self, process: str) -> None:
        """`process`'s pause ended before its hold ran out (an aimed pause, `aim`)."""
        self._paused.pop(process, None)

    def mark(self, truth: TruthLog) -> None:
        """Mark the silenced writes, and the duplicates that only they make duplicates, once
        every worker of the run is stopped."""
        spans = [s for s in map(self._silenced, self._exits) if s is not None]
        if not spans:
            return
        marked: list[Write] = []
        # Per key: the code that silenced every write of it so far, or _HEARD once one was not.
        earlier: dict[tuple[str, str], str] = {}
        for w in sorted(truth.writes(), key=lambda w: w.at):
            key = (w.workflow_key, w.effect_key)
            process = w.process or w.executor
            code = next((c for name, c, a, b in spans if process == name and a <= w.at <= b), None)
            # An attempt makes nothing: never a duplicate, nor what makes one.
            echo = earlier.get(key, _HEARD) if w.owned and w.committed else _HEARD
            blind = code or (None if echo == _HEARD else echo)
            marked.append(w.model_copy(update={"blind": blind}) if blind and w.blind is None else w)
            if w.committed:
                earlier[key] = _HEARD if code is None else earlier.get(key, code)
        truth.rewrite(marked)

    def _silenced(self, exit_: _Exit) -> _Span | None:
        """(process, code, from, to) of the writes whose events this exit may have lost.

        A shutdown's exit flush ran out when the exit took at least its bound and Kafka was down
        at some moment of the bound's last span. That outage may have begun after the signal,
        and the events may have been held since an earlier one: the writes from the first
        outage met between the signal and the exit are lost (celery run 16 of 50b6f43)."""
        process, fault, held, at, gone = exit_
        outages = [o for o in self._spans() if o[0] <= gone and o[1] >= at]
        if fault is Fault.CRASH_RESTART:
            outage = next((o for o in outages if o[0] <= at <= o[1]), None)
            start = held if outage is None else min(held, outage[0])
            return process, KILLED_UNSENT, start - UNSENT_S, at
        flush = gone - DEFAULT_EXIT_FLUSH_S
        if flush >= at and any(o[1] >= flush for o in outages):
            return process, SHUTDOWN_UNSENT, min(o[0] for o in outages) - UNSENT_S, gone
        return None

    def _spans(self) -> list[tuple[float, float]]:
        down = self.outages.down_since
        return [*self.outages.spans, *([] if down is None else [(down, time.time())])]
