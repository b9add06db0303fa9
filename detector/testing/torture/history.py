"""Generated histories for the torture harness: thousands of workflows, every condition planted.

Each workflow follows one scenario with its own `seq`; workflows are interleaved at random, and
a few scenarios deliberately deliver events out of `seq` order (late buffered evidence, late
acquisitions), which the engine must judge by `seq`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

Event = dict[str, Any]
_T0 = datetime(2026, 7, 26, 10, 0, tzinfo=UTC)


class _Flow:
    """Builds one workflow's events in the order they will be delivered."""

    def __init__(self, wf: str, rng: random.Random) -> None:
        self.wf = wf
        self.rng = rng
        self.seq = 0
        self.events: list[Event] = []

    def add(self, kind: str, epoch: int, worker: str, **extra: Any) -> Event:
        self.seq += 1
        ev: Event = {
            "event_id": f"{self.wf}/{self.seq}",
            "seq": self.seq,
            "kind": kind,
            "workflow_key": self.wf,
            "owner_epoch": epoch,
            "worker_id": worker,
            "observed_at": (_T0 + timedelta(seconds=self.seq)).isoformat(),
            **extra,
        }
        self.events.append(ev)
        return ev

    def acquire(self, epoch: int, worker: str) -> Event:
        return self.add(
            "lease_acquired",
            epoch,
            worker,
            source="coordinator",
            lease_duration_s=90,
            heartbeat_interval_s=30,
            attrs={"tool_class": self.rng.choice(["export", "browser", "indexer"])},
        )

    def work(self, epoch: int, worker: str, n: int) -> None:
        for _ in range(n):
            kind = self.rng.choice(["heartbeat", "progress"])
            self.add(kind, epoch, worker)

    def commit(self, epoch: int, worker: str, key: str, source: str = "destination") -> None:
        self.add("effect_attempted", epoch, worker, effect_key=key, destination="dest")
        self.add(
            "effect_committed", epoch, worker, effect_key=key, destination="dest", source=source
        )


def _healthy(f: _Flow) -> None:
    f.acquire(1, "w1")
    f.work(1, "w1", f.rng.randint(2, 8))
    f.commit(1, "w1", f"{f.wf}/out")
    f.add("outcome_verified", 1, "verifier", effect_key=f"{f.wf}/out", source="verifier")
    f.add("lease_released", 1, "w1")


def _clean_handoff(f: _Flow) -> None:
    f.acquire(1, "w1")
    f.work(1, "w1", 3)
    f.commit(1, "w1", f"{f.wf}/part-1")
    f.add("lease_lost", 1, "w1")
    f.acquire(2, "w2")
    f.work(2, "w2", 3)
    f.commit(2, "w2", f"{f.wf}/part-2")


def _stale_activity(f: _Flow) -> None:
    f.acquire(1, "w1")
    f.work(1, "w1", 2)
    f.acquire(2, "w2")
    f.work(1, "w1", f.rng.randint(1, 4))
    f.work(2, "w2", 2)
    f.add("lease_lost", 1, "w1")


def _stale_rejected(f: _Flow) -> None:
    f.acquire(3, "w1")
    f.acquire(4, "w2")
    f.add("effect_attempted", 3, "w1", effect_key=f"{f.wf}/mail")
    f.add("effect_rejected", 3, "w1", effect_key=f"{f.wf}/mail", source="destination")
    f.add("outcome_verified", 4, "verifier", effect_key=f"{f.wf}/mail", source="verifier")


def _stale_commit_and_duplicate(f: _Flow) -> None:
    key = f"{f.wf}/release-index"
    f.acquire(17, "alpha")
    f.work(17, "alpha", 1)
    f.acquire(18, "beta")
    f.work(17, "alpha", 1)
    f.commit(17, "alpha", key)
    f.commit(18, "beta", key)


def _retry(f: _Flow) -> None:
    f.acquire(5, "w1")
    f.commit(5, "w1", f"{f.wf}/capture")
    f.add("effect_committed", 5, "w1", effect_key=f"{f.wf}/capture", source="destination")


def _late_buffered(f: _Flow) -> None:
    """A pre-takeover checkpoint delivered after the acquisition: nothing to report."""
    f.acquire(1, "w1")
    early = f.add("progress", 1, "w1")
    f.acquire(2, "w2")
    f.work(2, "w2", 2)
    f.events.remove(early)
    f.events.append(early)


def _late_acquisition(f: _Flow) -> None:
    """The takeover's acquisition arrives after the stale events it displaces."""
    f.acquire(1, "w1")
    acq = f.acquire(2, "w2")
    f.work(1, "w1", 2)
    f.add("effect_attempted", 1, "w1", effect_key=f"{f.wf}/upload")
    f.events.remove(acq)
    f.events.append(acq)


SCENARIOS: list[tuple[float, Callable[[_Flow], None]]] = [
    (0.55, _healthy),
    (0.15, _clean_handoff),
    (0.06, _stale_activity),
    (0.05, _stale_rejected),
    (0.05, _stale_commit_and_duplicate),
    (0.04, _retry),
    (0.05, _late_buffered),
    (0.05, _late_acquisition),
]


def generate(n_events: int, seed: int = 1) -> list[bytes]:
    """At least `n_events` JSON lines, workflows interleaved, each workflow's order kept."""
    rng = random.Random(seed)
    weights = [w for w, _ in SCENARIOS]
    flows: list[list[Event]] = []
    total = 0
    while total < n_events:
        flow = _Flow(f"tenant-{len(flows) % 37}/wf-{len(flows):06d}", rng)
        rng.choices([s for _, s in SCENARIOS], weights)[0](flow)
        flows.append(flow.events)
        total += len(flow.events)
    cursors = [0] * len(flows)
    live = list(range(len(flows)))
    out: list[bytes] = []
    while live:
        i = rng.randrange(len(live))
        idx = live[i]
        out.append(json.dumps(flows[idx][cursors[idx]], separators=(",", ":")).encode())
        cursors[idx] += 1
        if cursors[idx] == len(flows[idx]):
            live[i] = live[-1]
            live.pop()
    return out
