"""One source's campaign: a broker and a `splitbrain worker` reading the adapters' events, the
source's server, then seeded runs of its fleet under the nemesis; a read_committed reader stamps
each finding revision as it becomes visible; at the end, the checker's verdict.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from detector.contracts.findings import Finding
from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import (
    ReadError,
    Record,
    TopicReader,
    WorkerTopics,
    quiescent,
    read_committed,
)
from detector.devstack.worker import WorkerProcess
from detector.testing.campaign.checker import Seen, Verdict, check
from detector.testing.campaign.nemesis import CAMPAIGN_FAULTS, Fault, Step, plan
from detector.testing.campaign.source import CampaignEnv, Fleet, KafkaOutages, RunEnv, Source
from detector.testing.campaign.truth import TruthLog, Write

log = logging.getLogger(__name__)

DRAIN_S = 120.0  # a run's work, after its faults heal
SETTLE_S = 300.0  # the detector, to read every event of the campaign (and recover from a restart)
_BOUNCING = threading.Lock()


@dataclass
class SourceResult:
    """One source's campaign: the verdict and what was done to get it."""

    source: str
    seed: int
    runs: int
    verdict: Verdict
    writes: int
    faults: Counter[str] = field(default_factory=Counter)
    undrained_runs: list[int] = field(default_factory=list)
    # The exits of the detector (its stall watch gives up on a Kafka that does not take a
    # commit, so that a supervisor restarts it) and of a source's watcher, by role; each was
    # started again, as a supervisor would.
    restarts: Counter[str] = field(default_factory=Counter)
    # Each broker restart: when it went down and when it served again (wall clock).
    outages: Sequence[tuple[float, float]] = ()
    restarted_runs: set[int] = field(default_factory=set)  # the runs with a broker restart
    # Each run's schedule and when it began (wall clock): what the report puts beside a slow
    # finding.
    schedules: dict[int, tuple[float, tuple[Step, ...]]] = field(default_factory=dict)
    seconds: float = 0.0


class _Watcher(threading.Thread):
    """Reads the findings topic as a downstream consumer does, stamping each revision with the
    moment it became readable.

    A reader that lived through a broker restart can stop short of the topic's end for minutes
    (seen in the campaign: findings the detector wrote at once, stamped minutes late), so after
    each restart, and after a read error, it reads from a fresh reader (what it saw before is
    skipped by offset)."""

    def __init__(self, config: dict[str, Any], topic: str, outages: KafkaOutages) -> None:
        super().__init__(name="campaign-findings", daemon=True)
        self._config = config
        self._topic = topic
        self._outages = outages
        self._reader: TopicReader | None = None
        self._opened_after = 0  # the outages that had ended when the reader was opened
        self._halt = threading.Event()
        self._read_at: set[tuple[int, int]] = set()
        self.seen: list[Seen] = []

    def run(self) -> None:
        while not self._halt.is_set():
            self._take(self._read())
        self._close()

    def finish(self) -> list[Seen]:
        """Stop, then read the topic to its end with a fresh reader: what the watcher had not
        seen yet is stamped now."""
        self._halt.set()
        self.join()
        self._take(read_committed(self._config, self._topic))
        return self.seen

    def _read(self) -> list[Record]:
        ended = len(self._outages.spans)
        try:
            if self._reader is None or ended > self._opened_after:
                self._close()
                self._reader = TopicReader(self._config, self._topic)
                self._opened_after = ended
            return self._reader.poll(0.2)
        except (ReadError, KafkaException) as exc:  # a broker restart: a fresh reader next
            log.info("findings reader: %s", exc)
            self._close()
            time.sleep(0.2)
            return []

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _take(self, records: list[Record]) -> None:
        now = time.time()
        for r in records:
            if (r.partition, r.offset) not in self._read_at:
                self._read_at.add((r.partition, r.offset))
                self.seen.append(Seen(Finding.model_validate_json(r.value), now))


@contextlib.contextmanager
def _broker(
    workdir: Path, bootstrap: str | None
) -> Iterator[tuple[dict[str, Any], LocalKafka | None]]:
    if bootstrap is not None:
        yield {"bootstrap.servers": bootstrap}, None
        return
    broker = LocalKafka(workdir / "kafka")
    broker.start()
    try:
        yield dict(broker.client_config()), broker
    finally:
        broker.stop()


def campaign(
    source: Source,
    *,
    runs: int,
    seed: int,
    workdir: Path,
    bootstrap: str | None = None,
    say: Callable[[str], None] = print,
) -> SourceResult:
    """Run `runs` seeded runs of `source` and check them. With `bootstrap`, an existing broker
    is used (fresh topics on it) and the nemesis does not restart it."""
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    result = SourceResult(source.name, seed, runs, Verdict(), 0)
    writes: list[Write] = []
    with _broker(workdir, bootstrap) as (config, broker):
        topics = WorkerTopics.fresh(f"campaign-{source.name}").create(config, 1)
        detector = WorkerProcess(config, topics, workdir / "detector", instance="campaign")
        env = CampaignEnv(config, topics.input, workdir, seed, say=say)
        result.restarts = env.restarts
        watcher = _Watcher(config, topics.findings, env.outages)
        supervised = env.supervised("detector", detector.alive, detector.start)
        with detector, source.session(env) as session, supervised:
            watcher.start()
            say(f"{source.name}: seed {seed}, {runs} runs; detector log {detector.log}")
            for n in range(runs):
                steps = plan(
                    seed,
                    n,
                    source.faults | (CAMPAIGN_FAULTS if broker is not None else frozenset()),
                    workers=source.workers,
                    span_s=source.span_s,
                    steps=source.steps,
                    holds=source.holds,
                )
                run_dir = workdir / f"run-{n:03d}"
                run_dir.mkdir(exist_ok=True)
                truth = TruthLog(run_dir / "truth.jsonl", n)
                run = RunEnv(env, n, truth, random.Random(f"{seed}:{n}:work"), run_dir)
                say(f"run {n}: " + ("; ".join(s.describe() for s in steps) or "no faults"))
                if any(s.fault is Fault.BROKER_RESTART for s in steps):
                    result.restarted_runs.add(n)
                with session.run(run) as fleet:
                    result.schedules[n] = (time.time(), steps)
                    _play(steps, fleet, broker, env.outages, result)
                    if not fleet.drain(DRAIN_S):
                        result.undrained_runs.append(n)
                        say(f"run {n}: its work did not finish within {DRAIN_S:g}s")
                run_writes = list(truth.writes())
                made = [w for w in run_writes if not w.attempt]
                stale = sum(not w.owned for w in made)
                tried = sum(not w.owned for w in run_writes if w.attempt)
                say(f"run {n}: {len(made)} effects, {stale} stale, {tried} stale attempt(s)")
                writes += run_writes
            _settle(config, topics)
            seen = watcher.finish()
    result.writes = sum(not w.attempt for w in writes)
    result.outages = env.outages.spans
    result.verdict = check(
        writes, seen, source.grade, source.blind, result.outages, result.restarted_runs
    )
    result.seconds = time.monotonic() - began
    return result


def _play(
    steps: tuple[Step, ...],
    fleet: Fleet,
    broker: LocalKafka | None,
    outages: KafkaOutages,
    result: SourceResult,
) -> None:
    """Apply the schedule at its offsets from now; returns once a restarted broker is back."""
    start = time.monotonic()
    bounces: list[threading.Thread] = []
    for step in steps:
        time.sleep(max(0.0, start + step.at_s - time.monotonic()))
        if step.fault is Fault.BROKER_RESTART:
            assert broker is not None
            bounces.append(_restart_later(broker, step.hold_s, outages))
        else:
            fleet.apply(step)
        result.faults[step.fault.value] += 1
    for bounce in bounces:
        bounce.join()


def _restart_later(broker: LocalKafka, down_s: float, outages: KafkaOutages) -> threading.Thread:
    """Stop the broker now and start it `down_s` later, without holding up the schedule; the
    outage lasts from the stop's start to the broker serving again."""

    def bounce() -> None:
        with _BOUNCING:  # two restarts in one run take turns
            outages.begin()
            broker.stop()
            time.sleep(down_s)
            broker.start()
            outages.end()

    thread = threading.Thread(target=bounce, name="campaign-broker", daemon=True)
    thread.start()
    return thread


def _settle(config: dict[str, Any], topics: WorkerTopics) -> None:
    """Wait until the detector has read every event of the campaign and published its
    findings."""
    admin = AdminClient(dict(config))
    deadline = time.monotonic() + SETTLE_S
    while not quiescent(admin, topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the detector did not catch up in {SETTLE_S:g}s")
        time.sleep(0.5)
