"""History generators for the property tests and the oracle.

A history is a list of `Row`s (compact, so a failing example prints readably) in arrival order;
`build` turns it into events. Generators first write each workflow in its *authoritative* order
(what really happened), then choose which events carry `seq`, then an arrival order:

- `"seq"`: every event carries seq and arrival is any permutation (DESIGN §4: findings must not
  depend on it);
- `"acyclic"`: mixed seq/no-seq, where the events without seq stay put and the seq events
  between two of them arrive in any order. The pairwise rule of §4 is then a total order equal to
  the authoritative one, so every field of a finding is defined;
- `"any"`: any permutation of a mixed history: the pairwise rule may have cycles, only what §4
  defines pairwise (which conditions exist) is compared;
- `"in_order"`: arrival is the authoritative order;
- `"acq_last"`: every event carries seq, and the acquisitions arrive after everything else
  (a coordinator's log read after the workers'): each displaces events that arrived before it;
- `"late_acq"` (`user_history` only): each acquisition arrives up to 60 places late.

Seq modes: `"all"` (seq on every event, each its own), `"tied"` (on every event, and some
neighbours share one: DESIGN §4 orders them an acquisition first, then by `event_id`),
`"mixed"`, `"none"`.

Small histories are drawn from structured strategies (hypothesis shrinks them); long ones
(hundreds of events per workflow) from a seeded `random.Random`, which is fast to generate;
`minimize` cuts a failing long history down for a report.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hypothesis import strategies as st

from detector.contracts.events import OwnershipEvent

from .histories import ev, event_obj


class Row(NamedTuple):
    """One event: (workflow, id, kind, epoch, worker, source, seq, effect key, observed_at)."""

    wf: str
    id: str
    kind: str
    epoch: int
    worker: str
    source: str
    seq: int | None
    key: str | None
    t: float | None


def build(rows: Sequence[Row]) -> list[OwnershipEvent]:
    return [
        ev(r.id, r.kind, r.wf, r.epoch, r.worker, seq=r.seq, key=r.key, source=r.source, t=r.t)
        for r in rows
    ]


def objs(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The rows as the JSON objects an emitter writes (for paths that read bytes)."""
    return [
        event_obj(
            r.id, r.kind, r.wf, r.epoch, r.worker, seq=r.seq, key=r.key, source=r.source, t=r.t
        )
        for r in rows
    ]


def row(wf: str, i: int, kind: str, epoch: int, key: str | None, src: str, t: float) -> Row:
    """A row in authoritative position `i` (seq is assigned later). Who emits follows DESIGN §3:
    the coordinator acquires, a verifier verifies, a worker attempts; commits and rejections come
    from a destination or are a worker's claim."""
    worker = f"w{epoch}"
    if kind == "lease_acquired":
        return Row(wf, f"{wf}-{i}", kind, epoch, worker, "coordinator", None, None, t)
    if kind == "outcome_verified":
        who = "checker" if src == "verifier" else worker
        return Row(wf, f"{wf}-{i}", kind, epoch, who, src, None, key, t)
    if kind == "effect_attempted":
        return Row(wf, f"{wf}-{i}", kind, epoch, worker, "worker", None, key, t)
    if kind in ("effect_committed", "effect_rejected"):
        return Row(wf, f"{wf}-{i}", kind, epoch, worker, src, None, key, t)
    if kind in ("heartbeat", "progress"):
        return Row(wf, f"{wf}-{i}", kind, epoch, worker, "worker", None, key or None, t)
    return Row(wf, f"{wf}-{i}", kind, epoch, worker, "worker", None, None, t)


def with_seq(rows: Sequence[Row], has_seq: Sequence[bool]) -> list[Row]:
    """Number the authoritative order 1, 2, ...; events with has_seq False get none."""
    pairs = enumerate(zip(rows, has_seq, strict=True))
    return [r._replace(seq=i + 1 if s else None) for i, (r, s) in pairs]


def tied(rows: Sequence[Row], same: Sequence[bool]) -> list[Row]:
    """Number the authoritative order, an event whose `same` is true at its predecessor's seq."""
    out: list[Row] = []
    seq = 0
    for i, (r, s) in enumerate(zip(rows, same, strict=True)):
        seq += 0 if s and i else 1
        out.append(r._replace(seq=seq))
    return out


# ---- small, shrinkable workflows --------------------------------------------------------------

KEYS = ("k0", "k1", "k2")
# what an owner (current or displaced) may do, weighted by repetition
ACTIONS = (
    "heartbeat",
    "heartbeat",
    "progress",
    "effect_attempted",
    "effect_committed",
    "effect_committed",
    "effect_rejected",
    "outcome_verified",
    "outcome_verified",
    "lease_lost",
    "lease_lost",
    "lease_released",
    "ownership_uncertain",
)
GAPS = (1.0, 5.0, 40.0, 650.0)  # seconds between events: 650 > the 600 s quiet period
SOURCES = ("destination", "destination", "worker")
VERIFIERS = ("verifier", "verifier", "verifier", "worker")  # a worker's "verified" is no proof


@st.composite
def small_workflow(draw: st.DrawFn, wf: str, seq: str = "all") -> list[Row]:
    """A split-brain-prone workflow in authoritative order: 1-4 epochs, acquired in epoch order
    or (sometimes) not, and any owner acquired so far may act."""
    n = draw(st.integers(1, 4))
    first = draw(st.integers(0, 30))
    steps = draw(st.lists(st.integers(1, 3), min_size=n - 1, max_size=n - 1))
    epochs = [first]
    for s in steps:
        epochs.append(epochs[-1] + s)
    if draw(st.sampled_from((False, False, False, True))):
        epochs = draw(st.permutations(epochs))
    t = float(draw(st.integers(0, 100)))
    out: list[Row] = []
    for i, epoch in enumerate(epochs):
        out.append(row(wf, len(out), "lease_acquired", epoch, None, "", t))
        acts = draw(
            st.lists(
                st.tuples(
                    st.integers(0, i),  # which acquired owner acts
                    st.booleans(),  # ... biased to the current one
                    st.sampled_from(ACTIONS),
                    st.sampled_from((*KEYS, "")),  # "" on activity: no effect key
                    st.sampled_from(SOURCES),
                    st.sampled_from(VERIFIERS),
                    st.sampled_from(GAPS),
                ),
                max_size=6,
            )
        )
        for who, current, kind, drawn_key, src, vsrc, gap in acts:
            t += gap
            actor = epoch if current else epochs[who]
            key = drawn_key or (None if kind in ("heartbeat", "progress") else KEYS[0])
            source = vsrc if kind == "outcome_verified" else src
            out.append(row(wf, len(out), kind, actor, key, source, t))
    if seq == "tied":
        return tied(out, draw(st.lists(st.booleans(), min_size=len(out), max_size=len(out))))
    return with_seq(out, draw(seq_flags(len(out), seq)))


@st.composite
def clean_workflow(draw: st.DrawFn, wf: str) -> list[Row]:
    """Handoffs only, every event with seq: each owner acts before the next takeover, each
    effect key once overall (a worker's claim plus the destination's confirmation allowed);
    after a takeover the old owner only says it lost or released, and verifiers may speak for
    any epoch."""
    n = draw(st.integers(1, 4))
    epochs = sorted(draw(st.sets(st.integers(0, 40), min_size=n, max_size=n)))
    out: list[Row] = []
    t = 0.0
    for i, epoch in enumerate(epochs):
        t += 1
        out.append(row(wf, len(out), "lease_acquired", epoch, None, "", t))
        if i > 0:
            for kind in draw(
                st.lists(
                    st.sampled_from(("lease_lost", "lease_released", "ownership_uncertain")),
                    max_size=2,
                )
            ):
                t += 1
                out.append(row(wf, len(out), kind, epochs[i - 1], None, "", t))
        acts = draw(st.lists(st.sampled_from((*ACTIONS[:-3], "claim+confirm")), max_size=6))
        for j, kind in enumerate(acts):
            t += draw(st.sampled_from(GAPS))
            key = f"e{epoch}-k{j}"
            if kind == "claim+confirm":
                out.append(row(wf, len(out), "effect_committed", epoch, key, "worker", t))
                out.append(row(wf, len(out), "effect_committed", epoch, key, "destination", t))
            elif kind == "outcome_verified":
                who = draw(st.sampled_from(epochs[: i + 1]))
                out.append(row(wf, len(out), kind, who, key, "verifier", t))
            else:
                out.append(row(wf, len(out), kind, epoch, key, "destination", t))
        if draw(st.booleans()):
            t += 1
            fence = draw(st.sampled_from(("lease_lost", "lease_released")))
            out.append(row(wf, len(out), fence, epoch, None, "", t))
    return with_seq(out, [True] * len(out))


def seq_flags(n: int, mode: str) -> st.SearchStrategy[list[bool]]:
    if mode in ("all", "tied"):
        return st.just([True] * n)
    if mode == "none":
        return st.just([False] * n)
    return st.lists(st.booleans(), min_size=n, max_size=n)


# ---- arrival orders -----------------------------------------------------------------------


def segments(rows: Sequence[Row]) -> list[list[Row]]:
    """Runs of seq events, each no-seq event a run of its own (the acyclic arrival's units)."""
    out: list[list[Row]] = []
    run: list[Row] = []
    for r in rows:
        if r.seq is None:
            if run:
                out.append(run)
            out.append([r])
            run = []
        else:
            run.append(r)
    if run:
        out.append(run)
    return out


@st.composite
def arrival(draw: st.DrawFn, per_wf: Sequence[Sequence[Row]], mode: str) -> list[Row]:
    """One arrival order of several workflows (see the module docstring for `mode`)."""
    arrived: list[list[Row]] = []
    for rows in per_wf:
        if mode in ("seq", "any"):
            arrived.append(list(draw(st.permutations(rows))))
        elif mode == "acq_last":
            acqs = [r for r in rows if r.kind == "lease_acquired"]
            arrived.append([r for r in rows if r.kind != "lease_acquired"] + acqs)
        elif mode == "acyclic":
            arrived.append([r for seg in segments(rows) for r in draw(st.permutations(seg))])
        else:
            arrived.append(list(rows))
    slots = [i for i, rows in enumerate(arrived) for _ in rows]
    return interleave(arrived, draw(st.permutations(slots)))


def interleave(per_wf: Sequence[Sequence[Row]], slots: Sequence[int]) -> list[Row]:
    """Merge workflows, keeping each one's own order: `slots` says whose turn it is."""
    its = [iter(rows) for rows in per_wf]
    return [next(its[i]) for i in slots]


def several(
    one: Callable[..., st.SearchStrategy[list[Row]]], seq: str = "all", most: int = 3
) -> st.SearchStrategy[list[list[Row]]]:
    """1..most workflows wf0, wf1, ... drawn from `one`, each in authoritative order."""

    @st.composite
    def draw_them(draw: st.DrawFn) -> list[list[Row]]:
        n = draw(st.integers(1, most))
        if one is clean_workflow:
            return [draw(one(f"wf{i}")) for i in range(n)]
        return [draw(one(f"wf{i}", seq)) for i in range(n)]

    return draw_them()


@st.composite
def history(draw: st.DrawFn, seq: str, mode: str, most: int = 3) -> tuple[list[Row], list[Row]]:
    """(authoritative order, an arrival order) of small workflows."""
    per_wf = draw(several(small_workflow, seq, most))
    return [r for rows in per_wf for r in rows], draw(arrival(per_wf, mode))


# ---- the shapes users send (tests/unit/test_campaign.py) ------------------------------------

EVERY_KIND = (
    "heartbeat",
    "progress",
    "effect_attempted",
    "effect_committed",
    "effect_rejected",
    "outcome_verified",
    "lease_lost",
    "lease_released",
    "ownership_uncertain",
)
KEYED = ("effect_attempted", "effect_committed", "effect_rejected", "outcome_verified")
EVERY_SOURCE = ("coordinator", "worker", "destination", "verifier")
# Who usually asserts a kind (DESIGN §3); one event in five comes from any source instead.
USUAL_SOURCE = {
    "effect_committed": ("destination", "worker"),
    "effect_rejected": ("destination", "worker"),
    "outcome_verified": ("verifier", "worker"),
}
FAMILIES = ("a", "m", "z")  # effect key families: each sorts before or after the others
ORDERS = ("up", "down", "scattered")  # a burst's keys in their sort order, reversed, or neither
SEQ_MODES = ("all", "tied", "mixed", "none")
ARRIVALS = {
    "all": ("in_order", "seq", "acq_last", "late_acq"),
    "tied": ("in_order", "seq", "acq_last", "late_acq"),
    "mixed": ("in_order", "acyclic", "any", "late_acq"),
    "none": ("in_order", "any", "late_acq"),
}


def effect_key(family: str, j: int, order: str = "up") -> str:
    """The j-th key of a family, numbered so a run of keys sorts as `order` says."""
    n = {"up": j, "down": 99 - j, "scattered": j * 37 % 100}[order]
    return f"{family}{n:02d}"


def lengthened(rows: Sequence[Row], where: str) -> list[Row]:
    """The same history with names as long as the contract allows (workflow key and effect keys
    512 characters, worker ids 256), padded with "!" (below every character the generators use)
    at the `"end"`, or in the `"middle"` so that long names share a long prefix. Applied by the
    tests, so a falsifying example still prints short."""

    def pad(name: str, size: int) -> str:
        fill = "!" * (size - len(name))
        return name + fill if where == "end" else name[:1] + fill + name[1:]

    return [
        r._replace(
            wf=pad(r.wf, 512),
            worker=pad(r.worker, 256),
            key=None if r.key is None else pad(r.key, 512),
        )
        for r in rows
    ]


@st.composite
def source_for(draw: st.DrawFn, kind: str) -> str:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from(EVERY_SOURCE))
    return draw(st.sampled_from(USUAL_SOURCE.get(kind, ("worker",))))


@st.composite
def user_workflow(draw: st.DrawFn, wf: str, seq: str) -> list[Row]:
    """A workflow as users send them, in authoritative order: a chain of 1-6 takeovers (an epoch
    sometimes acquired again, acquisitions sometimes out of epoch order), and after each one a
    few moves by any owner acquired so far (the displaced ones are the zombies):

    - one event of any kind from any source, activity sometimes carrying an effect key;
    - a burst: one owner attempts, commits, is rejected on or has verified up to 30 keys of a
      family, in their sort order, reversed or scattered (more keys than a finding lists, keys
      that sort before and after those of other bursts);
    - a retry: one key committed twice under one epoch, by one worker or two.

    `observed_at` is sometimes absent (see `lengthened` for names as long as allowed)."""
    timed = draw(st.integers(0, 3)) > 0
    epochs = [draw(st.integers(0, 5))]
    for _ in range(draw(st.integers(0, 5))):
        epochs.append(epochs[-1] + draw(st.integers(0, 3)))
    if draw(st.integers(0, 4)) == 0:
        epochs = draw(st.permutations(epochs))
    out: list[Row] = []
    t = float(draw(st.integers(0, 100)))

    def add(kind: str, epoch: int, key: str | None, source: str, worker: str = "") -> None:
        out.append(
            Row(wf, f"{wf}-{len(out)}", kind, epoch, f"w{epoch}{worker}", source, None, key, t)
        )

    for i, epoch in enumerate(epochs):
        t += draw(st.sampled_from(GAPS))
        add(
            "lease_acquired", epoch, None, draw(st.sampled_from(("coordinator",) * 3 + ("worker",)))
        )
        for _ in range(draw(st.integers(0, 4))):
            actor = epochs[draw(st.integers(0, i))]
            shape = draw(st.sampled_from(("one", "one", "burst", "retry")))
            t += draw(st.sampled_from(GAPS))
            family = draw(st.sampled_from(FAMILIES))
            if shape == "one":
                kind = draw(st.sampled_from(EVERY_KIND))
                j = draw(st.integers(0, 3))
                keyed = kind in KEYED or (kind in ("heartbeat", "progress") and draw(st.booleans()))
                key = effect_key(family, j) if keyed else None
                add(kind, actor, key, draw(source_for(kind)))
            elif shape == "burst":
                kind = draw(st.sampled_from(KEYED))
                order = draw(st.sampled_from(ORDERS))
                source = draw(source_for(kind))
                for j in range(draw(st.integers(1, 30))):
                    t += 1.0
                    add(kind, actor, effect_key(family, j, order), source)
            else:
                key = effect_key(family, draw(st.integers(0, 3)))
                for worker in ("", draw(st.sampled_from(("", "b")))):
                    t += 1.0
                    add(
                        "effect_committed", actor, key, draw(source_for("effect_committed")), worker
                    )
    if not timed:
        out = [r._replace(t=None) for r in out]
    if seq == "tied":
        return tied(out, draw(st.lists(st.booleans(), min_size=len(out), max_size=len(out))))
    return with_seq(out, draw(seq_flags(len(out), seq)))


@st.composite
def late_acquisitions(draw: st.DrawFn, rows: Sequence[Row]) -> list[Row]:
    """Each acquisition arrives up to 60 places after its position (a coordinator's log read
    late): it may come after the very events it displaces."""
    delays = iter(draw(st.lists(st.integers(0, 60), min_size=len(rows), max_size=len(rows))))
    placed = [
        (i + next(delays) + 0.5 if r.kind == "lease_acquired" else float(i), r)
        for i, r in enumerate(rows)
    ]
    return [r for _, r in sorted(placed, key=lambda p: p[0])]


@st.composite
def user_history(
    draw: st.DrawFn, seq: Sequence[str] = SEQ_MODES, most: int = 2
) -> tuple[list[Row], list[Row]]:
    """(authoritative order, an arrival order) of 1..most `user_workflow`s, each with its seq
    mode drawn from `seq` and an arrival its mode allows (see the module docstring), the
    workflows interleaved."""
    per_wf: list[list[Row]] = []
    arrived: list[list[Row]] = []
    for i in range(draw(st.integers(1, most))):
        mode = draw(st.sampled_from(seq))
        rows = draw(user_workflow(f"wf{i}", mode))
        per_wf.append(rows)
        how = draw(st.sampled_from(ARRIVALS[mode]))
        if how == "late_acq":
            arrived.append(draw(late_acquisitions(rows)))
        else:
            arrived.append(draw(arrival([rows], how)))
    slots = [i for i, rows in enumerate(arrived) for _ in rows]
    return [r for rows in per_wf for r in rows], interleave(arrived, draw(st.permutations(slots)))


# ---- long workflows -----------------------------------------------------------------------

LONG_KINDS = (
    "heartbeat",
    "progress",
    "effect_attempted",
    "effect_committed",
    "effect_rejected",
    "outcome_verified",
    "lease_lost",
    "lease_released",
    "ownership_uncertain",
)
LONG_WEIGHTS = (35, 12, 12, 18, 3, 8, 2, 1, 1)


def long_workflow(rng: random.Random, wf: str, seq: str = "all") -> list[Row]:
    """Hundreds of events in authoritative order: 2-5 owners, each with a long run of
    heartbeats, progress and effects over a key pool of 3, 30 or 300 keys (reused keys make
    duplicates long after the first commit), zombies acting now and then, fences, and a tail
    that may verify every key, fence the zombies and go quiet."""
    n = rng.randint(2, 5)
    epochs = sorted(rng.sample(range(1, 100), n))
    if rng.random() < 0.15:  # an acquisition out of epoch order
        i = rng.randrange(n - 1)
        epochs[i], epochs[i + 1] = epochs[i + 1], epochs[i]
    pool = [f"{wf}/k{j}" for j in range(rng.choice((3, 30, 300)))]
    zombie_rate = rng.choice((0.0, 0.03, 0.1, 0.4))
    out: list[Row] = []
    used: list[str] = []
    t = rng.uniform(0, 100)

    def add(kind: str, epoch: int, key: str | None = None, src: str = "worker") -> None:
        nonlocal t
        t += rng.choice((1.0, 1.0, 5.0, 20.0)) if rng.random() > 0.02 else 650.0
        out.append(row(wf, len(out), kind, epoch, key, src, t))

    acquired: list[int] = []
    for epoch in epochs:
        add("lease_acquired", epoch)
        acquired.append(epoch)
        if len(acquired) > 1 and rng.random() < 0.3:
            add(rng.choice(("lease_lost", "lease_released", "ownership_uncertain")), acquired[-2])
        for _ in range(rng.randint(20, 150)):
            actor = acquired[-1]
            if len(acquired) > 1 and rng.random() < zombie_rate:
                actor = rng.choice(acquired[:-1])
            kind = rng.choices(LONG_KINDS, LONG_WEIGHTS)[0]
            key: str | None = None
            if kind in ("heartbeat", "progress"):
                key = rng.choice(pool) if rng.random() < 0.1 else None
            elif kind == "outcome_verified":
                key = rng.choice(used or pool)
            elif kind in LONG_KINDS[2:5]:
                key = rng.choice(used) if used and rng.random() < 0.3 else rng.choice(pool)
                used.append(key)
            src = rng.choice(SOURCES)
            if kind == "outcome_verified":
                src = rng.choice(VERIFIERS)
            add(kind, actor, key, src)
    if rng.random() < 0.5:  # a verifier sweep
        for key in dict.fromkeys(used):
            add("outcome_verified", acquired[-1], key, "verifier")
    if rng.random() < 0.5:  # the zombies learn they lost
        for epoch in acquired[:-1]:
            add(rng.choice(("lease_lost", "lease_released")), epoch)
    for _ in range(rng.randint(0, 2)):  # the current owner goes on, maybe after a silence
        t += rng.choice((10.0, 700.0))
        add("heartbeat", acquired[-1])
    flags = [True] * len(out)
    if seq == "tied":
        return tied(out, [rng.random() < 0.2 for _ in out])
    if seq == "none":
        flags = [False] * len(out)
    elif seq == "mixed":
        flags = [rng.random() < 0.7 for _ in out]
    return with_seq(out, flags)


def long_arrival(rng: random.Random, per_wf: Sequence[Sequence[Row]], mode: str) -> list[Row]:
    """An arrival order of long workflows: in order, nearly in order (late deliveries), or any
    order allowed by `mode` (as in `arrival`)."""
    arrived: list[list[Row]] = []
    for rows in per_wf:
        style = rng.choice(("in_order", "late", "shuffle")) if mode != "in_order" else "in_order"
        if style == "in_order":
            arrived.append(list(rows))
        elif mode == "acyclic":  # only the seq events between two no-seq events move
            arrived.append([r for seg in segments(rows) for r in rng.sample(seg, len(seg))])
        elif style == "late":  # each event may arrive up to 40 places late
            keyed = sorted(enumerate(rows), key=lambda ir: ir[0] + rng.uniform(0, 40))
            arrived.append([r for _, r in keyed])
        else:
            arrived.append(rng.sample(list(rows), len(rows)))
    slots = [i for i, rows in enumerate(arrived) for _ in rows]
    rng.shuffle(slots)
    return interleave(arrived, slots)


def long_history(seed: int, seq: str = "all", mode: str = "seq") -> tuple[list[Row], list[Row]]:
    """(authoritative order, arrival order) of one or two long workflows, from a seed."""
    rng = random.Random(seed)
    per_wf = [long_workflow(rng, f"wf{i}", seq) for i in range(rng.randint(1, 2))]
    return [r for rows in per_wf for r in rows], long_arrival(rng, per_wf, mode)


# ---- reports ------------------------------------------------------------------------------


def minimize(rows: Sequence[Row], fails: Callable[[list[Row]], bool]) -> list[Row]:
    """Delta debugging: drop chunks of rows while `fails` still holds (for reports only)."""
    cur = list(rows)
    chunk = max(1, len(cur) // 2)
    while chunk >= 1:
        i = 0
        shrunk = False
        while i < len(cur):
            trial = cur[:i] + cur[i + chunk :]
            if trial and fails(trial):
                cur = trial
                shrunk = True
            else:
                i += chunk
        if not shrunk:
            chunk //= 2
    return cur
