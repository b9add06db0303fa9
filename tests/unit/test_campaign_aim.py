"""The aimed pause (`detector.testing.campaign.aim`): the nemesis pauses a worker exactly where
it says it is inside its work, and resumes it only once a later owner wrote the key it is about
to write, so that its write lands stale whatever the machine's load."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from detector.testing.campaign.aim import Aim
from detector.testing.campaign.kills import Kills
from detector.testing.campaign.nemesis import Fault, Proc, Step
from detector.testing.campaign.source import KafkaOutages
from detector.testing.campaign.truth import TruthLog

ROOT = Path(__file__).resolve().parents[2]
PAUSE = Step(0.0, Fault.PAUSE_PAST_LEASE, 1, 5.0)
# A worker whose every unit of work says where an aimed pause may land, then writes a line.
WORKER = """
import os, sys, time
from pathlib import Path
from detector.testing.campaign.aim import Inside, hold_here
aim, out = Path(sys.argv[1]), Path(sys.argv[2])
while True:
    inside = Inside(
        workflow_key="t-1", executor="pod-1", epoch=3, effect_key="reply/t-1", pid=os.getpid()
    )
    hold_here(aim, inside)
    with out.open("a") as lines:
        lines.write("wrote\\n")
    time.sleep(0.02)
"""


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_an_aimed_pause_holds_the_worker_until_a_later_owner_wrote_its_key(
    tmp_path: Path,
) -> None:
    out, truth = tmp_path / "out", TruthLog(tmp_path / "truth.jsonl")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", WORKER, str(tmp_path / "w.aim"), str(out)]
    proc = Proc("pod-1", argv, env, tmp_path / "log").start()
    seen: list[tuple[bool, int, int]] = []  # (stopped, lines before, lines after the writes)

    def successor() -> None:
        assert proc.popen is not None
        deadline = time.monotonic() + 30
        while not _stopped(proc.popen.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        before = _lines(out)
        for epoch, key in ((3, "reply/t-1"), (4, "fork/t-1"), (4, "reply/t-1")):
            time.sleep(0.3)  # the nemesis reads the log meanwhile: only the last write ends it
            if key == "reply/t-1" and epoch == 4:
                # Looked at before the write that ends the pause: after it, the resume races.
                seen.append((_stopped(proc.popen.pid), before, _lines(out)))
            truth.record(
                workflow_key="t-1",
                effect_key=key,
                executor="pod-2",
                epoch=epoch,
                owned=True,
                evidence="",
            )

    try:
        while _lines(out) < 3:  # working, unarmed
            time.sleep(0.02)
        later = threading.Thread(target=successor)
        later.start()
        said = Aim(tmp_path / "w.aim", enter_s=30, hold_s=30).pause(
            proc, truth, Kills(KafkaOutages()), PAUSE
        )
        later.join()
        assert said.startswith("pod-1 paused inside its work on t-1 (epoch 3) for "), said
        assert said.endswith(", until pod-2 (epoch 4) wrote reply/t-1"), said
        ((stopped, before, after),) = seen
        assert stopped and before == after  # nothing done while the later owner wrote
        assert not (tmp_path / "w.aim").exists()
        grown = time.monotonic() + 30
        while _lines(out) == after and time.monotonic() < grown:
            time.sleep(0.02)
        assert _lines(out) > after  # resumed: its write lands after the later owner's
    finally:
        proc.stop()


def test_an_aim_at_a_worker_that_enters_no_work_gives_up_and_pauses_nothing(
    tmp_path: Path,
) -> None:
    proc = Proc("pod-1", ["sleep", "30"], dict(os.environ), tmp_path / "log").start()
    try:
        aim = Aim(tmp_path / "w.aim", enter_s=0.3, hold_s=30)
        said = aim.pause(proc, TruthLog(tmp_path / "truth.jsonl"), Kills(KafkaOutages()), PAUSE)
        assert said == "pod-1 entered no work (none left, or none in 0.3s)"
        assert proc.popen is not None and not _stopped(proc.popen.pid)
        assert not aim.path.exists()
    finally:
        proc.stop()
