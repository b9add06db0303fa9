"""An aimed pause: the nemesis's pause past the lease made to land where it makes a zombie.

A pause applied at its offset in the schedule lands wherever its worker is. It makes a zombie
only if it lands inside the work while the worker holds it, and lasts until another worker has
taken the same work over and written: on a loaded machine that is luck (the LangGraph campaign
test's seed made no zombie in two full CI runs of four). An aimed pause leaves nothing to timing:

1. the nemesis arms the worker's aim file (empty);
2. the worker, inside its work and holding it, writes in the file what it holds (`Inside`) and
   waits there until the file is gone (`hold_here`);
3. the nemesis pauses it (SIGSTOP), then removes the file;
4. it holds the pause until the truth log has a write of the key the worker is about to write,
   by a later owner of the same work, and then resumes it (SIGCONT): the worker's write lands
   after its successor's, stale.

Both of the nemesis's waits are bounded and said in the run's log: a worker that enters no work
(none is left, or none within a bound) is not paused, and a pause that no later owner overtakes
ends anyway.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from detector.testing.campaign.kills import Kills
from detector.testing.campaign.nemesis import Proc, Step
from detector.testing.campaign.truth import Owner, TruthLog, Write

POLL_S: Final = 0.02
IDLE_EVERY_S: Final = 1.0  # how often an armed aim asks whether any work is left


class Inside(Owner):
    """What an armed worker writes in its aim file: the work it holds, the key it is about to
    write, and its process (an answer of a process killed since is not the one to pause)."""

    effect_key: str
    pid: int


def hold_here(path: Path, inside: Inside) -> None:
    """In the worker, inside its work and holding it: when its aim file is armed, say so and
    wait there until the nemesis has paused this process and taken the aim back. Unarmed (no
    file): return at once."""
    try:
        # Never created here: an aim the nemesis took back (it gave up) stays taken.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except FileNotFoundError:
        return
    try:
        os.write(fd, json.dumps(inside).encode())
    finally:
        os.close(fd)
    while path.exists():
        time.sleep(POLL_S)


@dataclass(frozen=True)
class Aim:
    """The nemesis's side of one worker's aim file."""

    path: Path
    enter_s: float = 30.0  # for the worker to enter its work
    hold_s: float = 60.0  # for a later owner's write

    def pause(
        self,
        proc: Proc,
        truth: TruthLog,
        kills: Kills,
        step: Step,
        idle: Callable[[], bool] = lambda: False,
    ) -> str:
        """Apply the pause `step` to `proc` aimed (its `hold_s` is this aim's, not the
        schedule's), unless `idle()` says no work is left to enter first; returns what
        happened, for the run's log."""
        self.path.write_text("")
        try:
            inside = self._inside(proc, idle)
            if inside is None:
                return f"{proc.name} entered no work (none left, or none in {self.enter_s:g}s)"
            kills.note(proc.name, dataclasses.replace(step, hold_s=self.hold_s))
            proc.signal(signal.SIGSTOP)
        finally:
            self.path.unlink(missing_ok=True)
        began = time.monotonic()
        later = self._overtaken(truth, inside)
        proc.resume()
        kills.resumed(proc.name)
        held = (
            f"{proc.name} paused inside its work on {inside['workflow_key']} (epoch "
            f"{inside['epoch']}) for {time.monotonic() - began:.1f}s"
        )
        if later is None:
            return f"{held}: no later owner wrote {inside['effect_key']}"
        return f"{held}, until {later.executor} (epoch {later.epoch}) wrote {later.effect_key}"

    def _inside(self, proc: Proc, idle: Callable[[], bool]) -> Inside | None:
        """The armed worker's answer, once its running process gave it, or None after
        `enter_s` or once `idle()`."""
        deadline = time.monotonic() + self.enter_s
        asked = time.monotonic()
        while time.monotonic() < deadline:
            try:
                inside: Inside | None = json.loads(self.path.read_text() or "null")
            except ValueError:  # being written
                inside = None
            if inside is not None:
                if proc.popen is not None and inside["pid"] == proc.popen.pid:
                    return inside
                self.path.write_text("")  # a process killed since answered: armed again
            if time.monotonic() - asked > IDLE_EVERY_S:
                if idle():
                    return None
                asked = time.monotonic()
            time.sleep(POLL_S)
        return None

    def _overtaken(self, truth: TruthLog, inside: Inside) -> Write | None:
        """The first write of the key the paused worker is about to write, made by a later owner
        of its work, or None after `hold_s`."""
        deadline = time.monotonic() + self.hold_s
        while time.monotonic() < deadline:
            try:
                later = next(
                    (
                        w
                        for w in truth.writes()
                        if w.committed
                        and w.workflow_key == inside["workflow_key"]
                        and w.effect_key == inside["effect_key"]
                        and w.epoch > inside["epoch"]
                    ),
                    None,
                )
            except ValidationError:  # a line being appended
                later = None
            if later is not None:
                return later
            time.sleep(0.2)
        return None
