"""A simulated month: one worker partition's step and the pager bridge's, in one process, on a
fake clock; memory, the changelog and page-state must be flat after the retention horizon.

Why: nothing longer than a few hours has been run for real, and what grows over weeks (remnants
kept for ever, page-state records of every finding ever paged) shows only over weeks. Here 30
days take minutes, through the worker's own step (`PartitionProcessor.process` and `tick`, the
functions both runtimes call) and the bridge's own state (`PageState`), at the default periods
(quiet period 10 min, idle TTL 7 days, remnants 16 days, resolved pages 14 days).

The load, per partition: workflows start at `--workflows-per-hour` (Poisson), each owned by one
worker for 10 to 110 minutes, a progress event every 5 minutes and one committed effect; 90% end
with a release (evicted after the quiet period), 10% just stop (evicted once idle for 7 days).
`--split-brain` of them (3%) are taken over midway by a second worker while the first goes on:
a stale progress and a stale commit (a critical finding), the new owner's commit of the same key
(a failover duplicate), a verifier's `outcome_verified` 10 minutes later; half of the zombies
then say `lease_lost`, the other half fall silent and are fenced by the quiet period. Every
finding resolves, its workflow is forgotten down to a remnant after 7 idle days, and the remnant
goes 16 days later: the state is flat from about day 24 (7 + 16 days after the first findings).

The changelog is modelled as the broker leaves it after compaction: the latest value per key of
what the worker writes every simulated second (each transaction's changed states, a deletion
removing its key); page-state the same, of what the bridge writes (every sink takes each
delivery at once). Each simulated day prints: the process's RSS, the workflows tracked (and how
many are remnants), the changelog's live bytes, page-state's records and bytes, and the time to
restore each (the worker's `MemoryStore.load` of every record, the bridge's parse and
`PageState.restore` of every record), measured in a forked child so that the restore leaves
nothing in the parent's memory. Writes `docs/month.png`; asserts nothing.
Run: `python bench/bench_month.py [--days 30] [--workflows-per-hour 400] [--out docs/month.png]`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from matplotlib.figure import Figure

from detector.contracts.findings import Severity
from detector.contracts.page_state import PageStateRecord, SinkName
from detector.core import Config, Detector, FindingUpdate, encode_state
from detector.paging.state import PageState, SinkPolicy
from detector.runtime.processor import PartitionProcessor
from detector.runtime.store import MemoryStore
from detector.telemetry.metrics import WorkerMetrics

DAY: Final = 24 * 3600.0
START: Final = 1_800_000_000.0  # the fake clock's first second
COMMIT_EVERY_S: Final = 1.0  # a transaction per simulated second
EXPIRE_EVERY_S: Final = 60.0  # the bridge's `_EXPIRE_EVERY_S`
RESOLVED_RETENTION: Final = timedelta(days=14)  # `splitbrain page --resolved-retention-s`
POLICIES: Final = {
    SinkName.ALERTMANAGER: SinkPolicy(),
    SinkName.PAGERDUTY: SinkPolicy(Severity.CRITICAL),
}
Planned = tuple[float, int, bytes, bytes]  # time, tie-break, record key, value


@dataclass(frozen=True, slots=True)
class Day:
    day: int
    events: int
    rss_mb: float
    workflows: int
    remnants: int
    changelog_kb: float
    page_records: int
    page_kb: float
    worker_restore_ms: float
    bridge_restore_ms: float
    findings_open: int


def workflow(rng: random.Random, n: int, t0: float, split_share: float) -> list[Planned]:
    """One workflow's events, planned from its start (see the module)."""
    key = f"tenant-{n % 97}/job-{n}"
    lines: list[tuple[float, dict[str, object]]] = []
    seq = 0

    def emit(t: float, kind: str, epoch: int, worker: str, **extra: object) -> None:
        nonlocal seq
        seq += 1
        lines.append((t, {"kind": kind, "owner_epoch": epoch, "worker_id": worker, **extra}))

    life = rng.uniform(600, 6600)
    emit(t0, "lease_acquired", 1, "w-a", lease_duration_s=90, heartbeat_interval_s=30)
    effect = f"{key}/export"
    split = rng.random() < split_share
    takeover = t0 + life / 2
    t = t0 + 300
    while t < t0 + life:
        if not split or t < takeover:
            emit(t, "progress", 1, "w-a")
        else:
            emit(t, "progress", 2, "w-b")
        t += 300
    if split:
        emit(takeover, "lease_acquired", 2, "w-b", lease_duration_s=90, heartbeat_interval_s=30)
        emit(takeover + 30, "progress", 1, "w-a")  # the zombie goes on
        emit(takeover + 60, "effect_committed", 1, "w-a", effect_key=effect)
        emit(takeover + 90, "effect_committed", 2, "w-b", effect_key=effect)
        if rng.random() < 0.5:
            emit(takeover + 120, "lease_lost", 1, "w-a")
        emit(
            takeover + 600, "outcome_verified", 2, "verifier", effect_key=effect, source="verifier"
        )
        owner = (2, "w-b")
    else:
        emit(t0 + life / 2, "effect_committed", 1, "w-a", effect_key=effect)
        owner = (1, "w-a")
    if rng.random() < 0.9:
        emit(t0 + life, "lease_released", *owner)
    lines.sort(key=lambda line: line[0])
    planned = []
    for i, (at, body) in enumerate(lines):  # seq in time order: the coordinator's counter
        doc = {"event_id": f"{n}-{i}", "workflow_key": key, "seq": i + 1, **body}
        planned.append((at, n * 1000 + i, key.encode(), json.dumps(doc).encode()))
    return planned


def arrivals(rng: random.Random, per_hour: float, until: float) -> Iterator[float]:
    t = START
    while True:
        t += rng.expovariate(per_hour / 3600)
        if t >= until:
            return
        yield t


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def restore_ms(changelog: dict[bytes, bytes], page: dict[bytes, bytes]) -> tuple[float, float]:
    """The time to restore each, in a forked child (what it builds never reaches our RSS)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report, leave without cleanup
        os.close(read)
        worker = min(_timed(_restore_worker, changelog) for _ in range(3))
        bridge = min(_timed(_restore_bridge, page) for _ in range(3))
        os.write(write, f"{worker} {bridge}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        worker, bridge = map(float, fh.read().split())
    os.waitpid(pid, 0)
    return worker, bridge


def _timed(restore: Callable[[dict[bytes, bytes]], object], records: dict[bytes, bytes]) -> float:
    """Milliseconds; the best of three, as other processes compete for the machine."""
    started = time.perf_counter()
    restore(records)
    return (time.perf_counter() - started) * 1000


def _restore_worker(changelog: dict[bytes, bytes]) -> MemoryStore:
    store = MemoryStore()
    for key, raw in changelog.items():
        store.load(key.decode(), raw)
    return store


def _restore_bridge(page: dict[bytes, bytes]) -> PageState:
    state = PageState(POLICIES)
    for raw in page.values():
        state.restore(PageStateRecord.model_validate_json(raw), 0)
    return state


class Month:
    """The worker's partition, its changelog, the bridge's state and its topic."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        detector = Detector(Config(), self.store.states)
        self.processor = PartitionProcessor(0, detector, WorkerMetrics())
        self.changelog: dict[bytes, bytes] = {}
        self.page = PageState(POLICIES)
        self.page_topic: dict[bytes, bytes] = {}
        self.changed: set[str] = set()
        self.offset = 0

    def event(self, key: bytes, value: bytes, now: float) -> None:
        outcome = self.processor.process(key, value, "agent.ownership.v1", self.offset, now)
        self.offset += 1
        self._out(outcome.findings, outcome.changed, now)

    def tick(self, now: float) -> None:
        outcome = self.processor.tick(now)
        if outcome is not None:
            self._out(outcome.findings, outcome.changed, now)

    def _out(self, findings: list[FindingUpdate], changed: set[str], now: float) -> None:
        self.changed |= changed
        for update in findings:
            self.page.observe(update.finding, 0, datetime.fromtimestamp(now, UTC))

    def commit(self, now: float) -> None:
        """The transaction: changed states to the changelog, and the bridge's batch."""
        states = self.store.states
        for key in self.changed:
            state = states.get(key)
            raw_key = key.encode()
            if state is None:
                self.changelog.pop(raw_key, None)
            else:
                self.changelog[raw_key] = encode_state(state)
        self.changed.clear()
        when = datetime.fromtimestamp(now, UTC)
        for delivery in self.page.plan():
            self.page.done(delivery, "accepted", when)
        self._save_page()

    def expire_pages(self, now: float) -> None:
        if self.page.expire(datetime.fromtimestamp(now, UTC), RESOLVED_RETENTION):
            self._save_page()

    def _save_page(self) -> None:
        for fid, _, record in self.page.take_unsaved():
            if record is None:
                self.page_topic.pop(fid.encode(), None)
            else:
                self.page_topic[fid.encode()] = record.to_json()

    def day(self, n: int, events: int) -> Day:
        states = self.store.states
        remnants = sum(1 for key in list(states) if (st := states.get(key)) and st.remnant_only)
        worker_ms, bridge_ms = restore_ms(self.changelog, self.page_topic)
        return Day(
            day=n,
            events=events,
            rss_mb=round(rss_mb(), 1),
            workflows=len(states),
            remnants=remnants,
            changelog_kb=round(sum(len(k) + len(v) for k, v in self.changelog.items()) / 1024, 1),
            page_records=len(self.page_topic),
            page_kb=round(sum(len(k) + len(v) for k, v in self.page_topic.items()) / 1024, 1),
            worker_restore_ms=round(worker_ms, 1),
            bridge_restore_ms=round(bridge_ms, 1),
            findings_open=sum(self.processor.detector.open_findings().values()),
        )


def simulate(days: int, per_hour: float, split_share: float, tick_s: float, seed: int) -> list[Day]:
    """The month, day by day: the events in time order, time passing between them in steps of
    `tick_s` (the worker's tick is 5 s of its clock; the quiet period 600 s)."""
    rng = random.Random(seed)
    month = Month()
    end = START + days * DAY
    starts = arrivals(rng, per_hour, end)
    queue: list[Planned] = []
    n = 0
    next_start: float | None = next(starts, None)
    clock = START
    next_expire = START + EXPIRE_EVERY_S
    out: list[Day] = []
    events = 0

    def until(t: float) -> None:
        nonlocal clock, next_expire
        while clock + tick_s <= t:
            clock += tick_s
            month.tick(clock)
            month.commit(clock)
            if clock >= next_expire:
                month.expire_pages(clock)
                next_expire += EXPIRE_EVERY_S

    for day in range(1, days + 1):
        midnight = START + day * DAY
        while True:
            while next_start is not None and (not queue or next_start <= queue[0][0]):
                for planned in workflow(rng, n, next_start, split_share):
                    heapq.heappush(queue, planned)
                n += 1
                next_start = next(starts, None)
            if not queue or queue[0][0] >= midnight:
                break
            at, _, key, value = heapq.heappop(queue)
            until(at)
            month.event(key, value, at)
            events += 1
        until(midnight)
        out.append(month.day(day, events))
        print(_row(out[-1]), flush=True)
        events = 0
    return out


COLUMNS: Final = tuple(f.name for f in fields(Day))


def _header() -> str:
    return " ".join(f"{name:>{max(len(name), 7)}}" for name in COLUMNS)


def _row(d: Day) -> str:
    doc = asdict(d)
    return " ".join(f"{doc[name]:>{max(len(name), 7)}}" for name in COLUMNS)


def spread(days: list[Day], name: str) -> str:
    values = [float(getattr(d, name)) for d in days]
    low, high = min(values), max(values)
    return f"{name} {low:g}..{high:g} ({(high - low) / high if high else 0.0:.1%})"


def plot(days: list[Day], out: Path, title: str, horizon: int) -> None:
    x = [d.day for d in days]
    fig = Figure(figsize=(10, 10))  # no pyplot: no display, no global state
    mem, log, page, restore = fig.subplots(4, 1, sharex=True)
    mem.plot(x, [d.rss_mb for d in days], color="tab:blue", marker=".")
    mem.set_ylabel("RSS (MB)", color="tab:blue")
    tracked = mem.twinx()
    tracked.plot(x, [d.workflows for d in days], color="tab:purple", alpha=0.6, label="workflows")
    tracked.plot(x, [d.remnants for d in days], color="tab:purple", linestyle=":", label="remnants")
    tracked.set_ylabel("states", color="tab:purple")
    tracked.legend(loc="upper left")
    log.plot(x, [d.changelog_kb for d in days], color="tab:green", marker=".")
    log.set_ylabel("changelog live KB")
    page.plot(x, [d.page_kb for d in days], color="tab:orange", marker=".")
    page.set_ylabel("page-state KB", color="tab:orange")
    records = page.twinx()
    records.plot(x, [d.page_records for d in days], color="tab:red", alpha=0.5)
    records.set_ylabel("page-state records", color="tab:red")
    restore.plot(x, [d.worker_restore_ms for d in days], label="worker (changelog)")
    restore.plot(x, [d.bridge_restore_ms for d in days], label="bridge (page-state)")
    restore.set_ylabel("restore (ms)")
    restore.set_xlabel("simulated day")
    restore.legend(loc="upper left")
    for ax in (mem, log, page, restore):
        ax.axvline(horizon, color="grey", linestyle="--", alpha=0.6)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--workflows-per-hour", type=float, default=400.0)
    ap.add_argument("--split-brain", type=float, default=0.03, help="share with a takeover")
    ap.add_argument("--tick-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--out", type=Path, default=Path("docs/month.png"))
    args = ap.parse_args()
    cfg = Config()
    # The first remnants are made an idle TTL after the first findings, and expire a remnant TTL
    # later: from then on as many go as come.
    horizon = math.ceil((cfg.idle_ttl_s + cfg.remnant_ttl_s + cfg.idle_sweep_s) / DAY)
    print(
        f"simulated month: {args.days} days, {args.workflows_per_hour:g} workflows/hour on one "
        f"partition ({args.split_brain:.0%} with a split brain), defaults: quiet period "
        f"{cfg.quiet_period_s:g} s, idle TTL {cfg.idle_ttl_s / DAY:g} d, remnants "
        f"{cfg.remnant_ttl_s / DAY:g} d, resolved pages {RESOLVED_RETENTION.days} d; flat from "
        f"day {horizon}"
    )
    print(_header())
    started = time.perf_counter()
    days = simulate(args.days, args.workflows_per_hour, args.split_brain, args.tick_s, args.seed)
    print(f"{time.perf_counter() - started:.0f} s of wall time")
    after = [d for d in days if d.day >= horizon]
    if after:
        names = ("rss_mb", "workflows", "changelog_kb", "page_records", "page_kb")
        print(f"from day {horizon}: " + "; ".join(spread(after, name) for name in names))
    title = (
        f"splitbrain: a simulated month, {args.workflows_per_hour:g} workflows/hour "
        f"(dashed: idle TTL + remnant TTL)"
    )
    plot(days, args.out, title, horizon)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
