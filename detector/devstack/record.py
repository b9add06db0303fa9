"""`STATE_DIR/stack.json`, what one command started for another to stop (`splitbrain dev
down`), and `STATE_DIR/lock`, which keeps two commands off one state directory."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from detector.devstack.components import leftovers, stop_record
from detector.devstack.errors import StackError, UnusableError
from detector.devstack.preflight import Say
from detector.devstack.process import Pid, send

STATE_FILE: Final = "stack.json"
LOCK_FILE: Final = "lock"
SCHEMA: Final = "splitbrain.dev-stack/v1"


@contextlib.contextmanager
def locked(state_dir: Path, command: str) -> Iterator[None]:
    """Hold `STATE_DIR/lock` (an advisory lock the kernel drops when the process ends); an
    `UnusableError` naming the holder when another command holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UnusableError(
            f"{state_dir} is in use by {holder}: wait for it to finish (or stop it), or give "
            "this run another --state-dir"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"`{command}` (pid {os.getpid()})\n")
        handle.flush()
        yield
    finally:
        handle.close()


def load_record(state_dir: Path) -> dict[str, Any] | None:
    """`stack.json` of `state_dir`, or None when there is none (or it cannot be read)."""
    try:
        doc = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def record_alive(record: Mapping[str, Any]) -> dict[str, bool]:
    """By component name: whether every recorded process of it runs."""
    out = {}
    for comp in record.get("components", []):
        pids = [Pid.from_json(p) for p in comp.get("pids") or []]
        out[comp["name"]] = bool(pids) and all(p.alive() for p in pids)
    return out


def stop_recorded(state_dir: Path, say: Say) -> int:
    """Stop, in reverse order, every component `stack.json` records that still runs; how many
    were running. The record is kept, marked stopped."""
    record = load_record(state_dir)
    if record is None:
        return 0
    stopped = 0
    errors = []
    running = [c for c in reversed(record.get("components", [])) if leftovers(c)]
    for comp in running:  # every process is asked at once, then each is waited for
        if comp.get("kind", "process") == "process":
            sig = signal.Signals[comp.get("stop_signal", "SIGTERM")]
            for pid in leftovers(comp):
                send(pid, signal.SIGCONT)
                send(pid, sig)
    for comp in running:
        try:
            stop_record(comp)
        except StackError as exc:
            errors.append(str(exc))
            continue
        stopped += 1
        say(f"stopped {comp['name']}")
    for comp in record.get("components", []):  # a server that died still has its files
        root = (comp.get("data") or {}).get("root")
        if root and not leftovers(comp):
            shutil.rmtree(root, ignore_errors=True)
    record["running"] = False
    record["stopped_at"] = now()
    write_json(state_dir / STATE_FILE, record)
    if errors:
        raise StackError("; ".join(errors))
    return stopped


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
