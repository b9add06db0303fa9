"""The fleet-shaped history of the worker's benches, and a worker's rate per third of it.

Why: a detector runs for months beside its fleet, so what a bench rates must have a fleet's
shape (workflows coming and going, a bounded number live at once, a few taken over by a zombie)
and show whether the rate holds as the state grows: by thirds of the history, not one mean.
`bench_fleet_worker.py` documents the two shapes; `bench_side_by_side.py` and
`bench_changelog_level.py` take them too.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from bench_engine import _event
from bench_worker import Throughput

FLAT: Final = 0.8  # last third / first third
ZOMBIE_EVERY: Final = 7  # one workflow in as many has a zombie, by default
LIFE: Final = 0.2  # a workflow's window, as a share of the history, without --live
OWNERS: Final = (2, 4)  # a long-lived workflow's owners, in turn
ZOMBIE_WRITES: Final = (10, 50)  # a long-lived workflow's zombie: its writes after the takeover
ACTIVITY: Final = ("heartbeat", "heartbeat", "progress", "effect_committed")

# A workflow's life, one step per event: what happens and the epoch of the owner who writes it.
ACQUIRE, RELEASE, ACT, ZOMBIE = "acquire", "release", "act", "zombie"
Step = tuple[str, int]
Life = Callable[[int, int, int, random.Random], list[Step]]


def short_life(w: int, per_workflow: int, zombie_every: int, rng: random.Random) -> list[Step]:
    """About `per_workflow` events of one owner; one workflow in `zombie_every` is taken over
    midway and its displaced owner commits once more."""
    n = max(3, per_workflow + rng.randint(-2, 2))
    if w % zombie_every:
        return [(ACQUIRE, 1)] + [(ACT, 1)] * (n - 1)
    takeover = max(2, n // 2)  # the new owner's acquisition, then the displaced owner's commit
    before = [(ACQUIRE, 1)] + [(ACT, 1)] * (takeover - 2)
    return [*before, (ACQUIRE, 2), (ZOMBIE, 1), *[(ACT, 2)] * (n - takeover - 1)]


def long_life(w: int, per_workflow: int, zombie_every: int, rng: random.Random) -> list[Step]:
    """About `per_workflow` events over 2 to 4 owners in turn, each handing over cleanly
    (released, then acquired by the next), the last releasing at the end. In one workflow in
    `zombie_every`, one takeover comes without a release and the displaced owner keeps writing:
    a commit, then 10 to 50 events among the new owner's first ones."""
    owners = rng.randint(*OWNERS)
    zombie_at = rng.randint(2, owners) if w % zombie_every == 0 else 0
    each = per_workflow // owners
    steps: list[Step] = []
    for epoch in range(1, owners + 1):
        acts = [(ACT, epoch)] * rng.randint(max(1, each // 2), max(1, each * 3 // 2))
        if epoch == zombie_at:
            writes = min(len(acts), rng.randint(*ZOMBIE_WRITES))
            for i in rng.sample(range(min(len(acts), 2 * writes)), writes):
                acts[i] = (ACT, epoch - 1)
            acts.insert(0, (ZOMBIE, epoch - 1))
        elif epoch > 1:
            steps.append((RELEASE, epoch - 1))
        steps += [(ACQUIRE, epoch), *acts]
    return [*steps, (RELEASE, owners)]


@dataclass(frozen=True, slots=True)
class Shape:
    """A workflow's life, and the history's size by default."""

    life: Life
    name: str
    workflows: int
    per_workflow: int
    live: int | None  # None: each workflow lives in a fifth of the history (`LIFE`)


SHAPES: Final = {
    "short": Shape(short_life, "one owner", 40_000, 8, None),
    "long": Shape(long_life, f"{OWNERS[0]} to {OWNERS[1]} owners in turn", 4_000, 1_200, 400),
}


def by_shape(of: Callable[[Shape], int | None]) -> str:
    """A flag's defaults, as its help says them."""
    return "default: " + ", ".join(f"{k} {of(v) or 'a fifth'}" for k, v in SHAPES.items())


def written(eid: int, w: int, seq: int, step: Step, rng: random.Random) -> bytes:
    """One step of workflow `w` as an event."""
    what, epoch = step
    wf = f"tenant-{w % 97}/fleet/{w:07d}"
    owner = f"worker-{(w + epoch) % 13}"
    if what == ACQUIRE:
        return _event(
            eid,
            "lease_acquired",
            wf,
            epoch,
            owner,
            seq,
            source="coordinator",
            lease_duration_s=90,
            heartbeat_interval_s=30,
            attrs={"tool_class": "export"},
        )
    if what == RELEASE:
        return _event(eid, "lease_released", wf, epoch, owner, seq, source="coordinator")
    if what == ZOMBIE:
        return _event(eid, "effect_committed", wf, epoch, owner, seq, effect_key=f"{wf}/z")
    kind = rng.choice(ACTIVITY)
    extra = {"effect_key": f"{wf}/{seq}"} if kind == "effect_committed" else {}
    return _event(eid, kind, wf, epoch, owner, seq, **extra)


def window(workflows: int, live: int | None) -> float:
    """A workflow's window, as a share of the history: with `live` of them live at once in the
    middle of it (starts uniform over 1 - window, so live = workflows x window / (1 - window))."""
    return LIFE if live is None else live / (workflows + live)


def fleet(
    workflows: int,
    per_workflow: int,
    zombie_every: int,
    *,
    live: int | None = None,
    life: Life = short_life,
    seed: int = 11,
) -> list[bytes]:
    """Each workflow's `life`, its events at random times in a window of the history
    (`window`), all in the order of their times."""
    rng = random.Random(seed)
    share = window(workflows, live)
    timed: list[tuple[float, bytes]] = []
    eid = itertools.count(1)
    for w in range(workflows):
        steps = life(w, per_workflow, zombie_every, rng)
        start = rng.random() * (1 - share)
        times = sorted(start + rng.random() * share for _ in steps)
        timed += (
            (at, written(next(eid), w, seq, step, rng))
            for seq, (at, step) in enumerate(zip(times, steps, strict=True), 1)
        )
    timed.sort(key=lambda t: t[0])
    return [line for _, line in timed]


@dataclass(frozen=True, slots=True)
class Thirds:
    """A worker's committed rate over each third of the history, and over all of it."""

    rates: tuple[float, float, float]
    whole: float

    @classmethod
    def of(cls, done: Throughput) -> Thirds:
        """From the first commit (the start and restore left out) to the last sample before
        the end (the partial last batch left out), as `Throughput.rate`."""
        samples, total = done.samples, done.total
        first = next(i for i, (_, n) in enumerate(samples) if n > 0)
        last = next(i for i, (_, n) in enumerate(samples) if n >= total)
        span = samples[first : max(first + 1, last)]
        marks = [span[0]]
        for k in (1, 2):
            marks.append(next((s for s in span if s[1] >= total * k / 3), span[-1]))
        marks.append(span[-1])
        rates = [
            (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else float("nan")
            for a, b in itertools.pairwise(marks)
        ]
        return cls((rates[0], rates[1], rates[2]), done.rate)

    @property
    def flat(self) -> float:
        """The last third's rate over the first's."""
        return self.rates[2] / self.rates[0] if self.rates[0] else float("nan")

    def line(self) -> str:
        a, b, c = self.rates
        return (
            f"{a:,.0f} | {b:,.0f} | {c:,.0f} events/s per third; whole run {self.whole:,.0f}; "
            f"last/first {self.flat:.2f} [target >= {FLAT}]"
        )
