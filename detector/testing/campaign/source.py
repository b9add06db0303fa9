"""What a campaign source is: a real coordination system, a fleet of workers on it whose work
makes effects at the recording destination, and what its adapter can show.

A source module under `detector.testing.campaign.sources` defines `source() -> Source`. The
campaign calls `session` once (the server starts), then `run` once per seeded run (the fleet
starts, works while the nemesis applies its schedule, and drains).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from detector.devstack.worker import connection_env
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.nemesis import Fault, Step
from detector.testing.campaign.truth import TruthLog
from detector.testing.campaign.worker import TOPIC_ENV


@dataclass
class KafkaOutages:
    """The broker restarts the campaign made: each (down, serving again), wall clock."""

    spans: list[tuple[float, float]] = field(default_factory=list)
    down_since: float | None = None  # the outage under way

    def begin(self) -> None:
        self.down_since = time.time()

    def end(self) -> None:
        assert self.down_since is not None
        self.spans.append((self.down_since, time.time()))
        self.down_since = None


@dataclass(frozen=True)
class CampaignEnv:
    """What every run of one campaign shares."""

    kafka: Mapping[str, Any]  # librdkafka settings of the broker the detector reads
    input_topic: str  # where the adapters send their events
    workdir: Path  # logs and data of the source's server and workers
    seed: int
    outages: KafkaOutages = field(default_factory=KafkaOutages)
    # The exits of the campaign's own long-running processes (`supervised`), by role.
    restarts: Counter[str] = field(default_factory=Counter)
    say: Callable[[str], None] = print

    @contextlib.contextmanager
    def supervised(
        self, role: str, alive: Callable[[], bool], start: Callable[[], object]
    ) -> Iterator[None]:
        """Start a process again whenever it exits, as its supervisor in production would (the
        detector gives up on a stalled Kafka by exiting), and count and say each exit."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(1.0):
                if not alive():
                    self.restarts[role] += 1
                    self.say(f"the {role} exited; starting it again")
                    start()

        thread = threading.Thread(target=watch, name=f"campaign-{role}-supervisor", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def process_env(self, **more: str) -> dict[str, str]:
        """A worker process's environment: the broker as `SPLITBRAIN_*` variables and the
        input topic its adapter sends to (`worker.sink`), plus `more`."""
        return connection_env(self.kafka, **{TOPIC_ENV: self.input_topic}, **more)


@dataclass(frozen=True)
class RunEnv:
    """One run: its index, its truth log, its seeded randomness (for the workload, never for the
    schedule) and its directory."""

    campaign: CampaignEnv
    run: int
    truth: TruthLog
    rng: random.Random
    workdir: Path

    def process_env(self, **more: str) -> dict[str, str]:
        return self.campaign.process_env(**self.truth.env(), **more)


class Fleet(Protocol):
    """The workers of one run, busy with its work."""

    def apply(self, step: Step) -> None:
        """Cause one fault of the source's `faults` (never a campaign's own)."""

    def drain(self, timeout_s: float) -> bool:
        """Heal every fault, then wait until all of the run's work is done or given up by the
        system (True), or `timeout_s` passes (False)."""


class Session(Protocol):
    def run(self, env: RunEnv) -> AbstractContextManager[Fleet]:
        """Start one run's fleet and work; leaving it stops every worker it started."""


class Source(Protocol):
    name: str
    faults: frozenset[Fault]  # what the nemesis may do here, besides the campaign's own
    holds: Mapping[Fault, tuple[float, float]]  # each fault's hold, (min, max) seconds
    workers: int  # the fleet's size: the nemesis picks targets among them
    span_s: float  # how long into a run faults may start
    steps: int  # faults per run
    grade: Grade  # what its events can show: their ordering, who confirms effects
    # What its adapter cannot see by design: code -> why (a `Write.blind` names the code).
    blind: Mapping[str, str]

    def missing(self) -> str | None:
        """Why the source cannot run here (a package or a server missing), or None."""

    def session(self, env: CampaignEnv) -> AbstractContextManager[Session]:
        """Start the coordination system; leaving it stops it."""
