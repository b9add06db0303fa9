"""What the campaign's leader-election workers (etcd, Kubernetes) share: the orders the fleet
gives them by signal, the shape of their work, and the retries a worker makes while its
coordinator is out of reach.

A worker process is a candidate for every shard of its run, one thread each; the leader of a
shard does the shard's units in order, one effect per unit (`shard-K/unit-I`), and moves the
shard's cursor on after each. A worker prefers one shard (its index): it tries it often and the
others seldom, so that each leads about one and a fault on any worker lands inside work.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Final, Protocol, SupportsIndex, TypeVar

from detector.adapters import AdapterSink

log = logging.getLogger(__name__)

T = TypeVar("T")

SIT_OUT_S: Final = 3.0  # after a handoff, long enough for another worker to win
RETRY_S: Final = 0.2
PREFERRED_TRY_S: Final = 0.25  # how often a worker tries its own shard
OTHER_TRY_S: Final = 1.0  # and the others
READY: Final = "ready"  # what a worker logs once it can work
FIRST_OTHER_S: Final = 3.0  # before a worker first tries a shard it does not prefer
RESIGN_S: Final = 15.0  # what a stop order waits for the leaders to resign


class Orders:
    """The fleet's signals: SIGTERM stop (finish the unit, resign, exit), SIGUSR1 hand off (resign
    every shard at the next unit's end, then sit out), SIGUSR2 make the next unit raise before
    its effect (the worker retries it)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._handoff_at = -1.0
        self._failures = 0
        self._leaders = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)
        signal.signal(signal.SIGUSR2, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        with self._lock:
            if signum == signal.SIGTERM:
                self.stopping.set()
            elif signum == signal.SIGUSR1:
                self._handoff_at = time.monotonic()
            else:
                self._failures += 1

    def handed_off_since(self, since: float) -> bool:
        """A handoff was ordered after `since` (time.monotonic())."""
        return self._handoff_at > since

    def sitting_out(self) -> bool:
        return time.monotonic() < self._handoff_at + SIT_OUT_S

    def take_failure(self) -> bool:
        """Whether this unit is the one to fail (once per SIGUSR2)."""
        with self._lock:
            if self._failures:
                self._failures -= 1
                return True
            return False

    def leading(self, since: float) -> bool:
        """A leader goes on to its next unit."""
        return not self.stopping.is_set() and not self.handed_off_since(since)

    def wait_for_the_preferred(self, preferred: bool) -> None:
        """Before the first try at a shard this worker does not prefer: time for the worker
        that prefers it to win it, its first call to the coordinator included."""
        if not preferred:
            self.stopping.wait(FIRST_OTHER_S)

    def wait_to_try(self, preferred: bool) -> None:
        """Between tries to win a shard."""
        self.stopping.wait(PREFERRED_TRY_S if preferred else OTHER_TRY_S)

    def began(self) -> float:
        """A leadership began (what a stop order waits for, until `ended`): when, in
        time.monotonic()."""
        with self._lock:
            self._leaders += 1
        return time.monotonic()

    def ended(self) -> None:
        """A leadership ended, resigned if it could."""
        with self._lock:
            self._leaders -= 1

    def resigned(self) -> bool:
        return self._leaders == 0


def retrying(call: Callable[[], T], what: str, *, fatal: tuple[type[BaseException], ...] = ()) -> T:
    """`call` until it answers: a partition or a coordinator restart makes calls fail for a
    while, and a worker in the middle of a unit waits it out (so a write it began lands late,
    as a real one does). A `fatal` error is raised (the elector's order to stop leading, which
    a retry must not swallow)."""
    while True:
        try:
            return call()
        except fatal:
            raise
        except Exception as exc:
            log.info("%s failed (%s); retrying", what, type(exc).__name__)
            time.sleep(RETRY_S)


def effect_key(shard: int, unit: int) -> str:
    return f"shard-{shard}/unit-{unit}"


def fenced(shard: int, unit: int) -> bool:
    """Every third unit writes through the coordinator's fence; the rest do not (a fenced write
    refused is a stale effect rejected, an unfenced one that lands a stale effect committed)."""
    return (shard + unit) % 3 == 0


def arguments(description: str) -> argparse.ArgumentParser:
    """The flags every election worker takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--units", type=int, required=True, help="units of work per shard")
    p.add_argument("--prefer", type=int, required=True, help="the shard this worker prefers")
    p.add_argument("--work-s", type=float, default=0.5, help="how long a unit works")
    p.add_argument("--go", type=Path, required=True, help="the fleet creates it: start working")
    return p


def _sleep(seconds: float | SupportsIndex) -> None:
    threading.Event().wait(float(seconds))


def serve(orders: Orders, shards: int, go: Path, run_shard: Callable[[int], None]) -> None:
    """Once `go` exists (the whole fleet is up: no worker takes every shard while the others
    are still starting), one thread per shard running `run_shard(index)` until the stop order;
    returns once every leader has resigned."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
    if "faketime" in os.environ.get("LD_PRELOAD", ""):
        # libfaketime (0.9.10) fails `time.sleep` with EINVAL while it leaves the monotonic
        # clock alone (`nemesis.clock_env`); a condition's timed wait works. Every sleep of the
        # process, its libraries' included (the Kubernetes elector's), waits that way.
        time.sleep = _sleep
    orders.install()
    log.info(READY)
    while not go.exists() and not orders.stopping.is_set():
        time.sleep(0.05)
    threads = [
        threading.Thread(target=run_shard, args=(k,), name=f"shard-{k}", daemon=True)
        for k in range(shards)
    ]
    for t in threads:
        t.start()
    orders.stopping.wait()
    deadline = time.monotonic() + RESIGN_S
    # Every leader resigns; a candidate blocked in its election is left behind.
    while not orders.resigned() and time.monotonic() < deadline:
        time.sleep(0.05)


class Worker(Protocol):
    orders: Orders
    sink: AdapterSink

    def run_shard(self, shard: int) -> None: ...


def main(parser: argparse.ArgumentParser, worker: Callable[[argparse.Namespace], Worker]) -> None:
    """A worker process: its flags parsed, its shards served until the stop order, then its
    adapter's events flushed (5 s at most)."""
    args = parser.parse_args()
    made = worker(args)
    serve(made.orders, args.shards, args.go, made.run_shard)
    made.sink.close(5)
