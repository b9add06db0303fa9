"""A brute-force oracle for DESIGN §3-§4, written from the text alone (it never imports
detector.core), so that the engine's indexes, caps and shortcuts are checked against the rules
as an operator reads them.

Input: the events in the order they were fed to the detector (arrival order).

Identity. Events are deduplicated per workflow by `event_id`: the first arrival wins, and a
later event with that id changes nothing, whatever its seq or content. Arrival positions count
the surviving events only (any monotone numbering gives the same pairwise answers).

Order. `before(a, b)` is the one pairwise rule of §4: by `seq` when both carry one, else by
arrival; two events at one `seq` are ordered an acquisition first, then by `event_id` (never by
arrival). In mixed seq/no-seq workflows that relation may be cyclic. What §4 defines pairwise is
computed from `before` alone for any history: which events are stale, which conditions and
findings exist, severity; "the last" of a set (the last stale event, the latest condition) is the
member no other member follows, and when a cycle leaves none, the last by seq (decision:
DESIGN names none; arrival then decides nothing); a fence counts when it is not before any
stale event of its epoch; `current`; the ordering. What needs "the earliest" (witnesses, the
transition) and silence on believed times is only defined when the relation is a total order:
for a cyclic workflow those fields are None and tests must not compare them (a status that
hinges on silence there included).

Rules, as modelled:

- stale: a progress/heartbeat/effect_attempted/effect_committed/effect_rejected event of epoch e
  with some acquisition of an epoch > e before it. progress/heartbeat give one `stale_activity`
  (effect key dropped: not an affected key). An effect_rejected from any source is a
  `stale_effect_rejected` condition; only a destination's counts as confirmation and as a fence.
- failover duplicate: a key committed (any source) under two epochs with no epoch between them
  that committed it too, in the finding of the lower one (so a key committed under several epochs
  gives one duplicate per consecutive pair, DESIGN §4); triggered by the later commit of each such
  pair of commits. retry duplicate: a key committed twice
  under one epoch by the same source (distinct ids), a finding of its own (`displaced` null).
- a condition's witness is its earliest trigger (for a duplicate this is the later of the two
  earliest commits); the latest condition is the last trigger of any condition, repeats
  included; `current` is the highest epoch acquired before it, None when none is.
- transition: a condition's is the transition of its witness, the earliest acquisition of a
  higher epoch before it; the finding's is that of its first listed condition: the first
  witness placed by seq when the ordering is authoritative, else the earliest witness.
- resolved = fenced and verified. fenced: no stale event (vacuous), or a lease_lost /
  lease_released of the displaced epoch, or a destination's effect_rejected of it, that is not
  before any stale event of the epoch, or (audit, after `finish()`) silence. verified: every
  trigger of a condition on an affected key has a verifier's outcome_verified of that key after
  it (pairwise; in a total order: one after the latest trigger).
- silence (audit): the workflow's events are walked in its order; a time more than the clock-skew
  bound beyond the latest believed time is pending until an event from a different worker or
  source reports a time within the bound of it (then both are believed). Decision: belief is
  final, i.e. taken at the end of the history. Silence is measured from the displaced epoch's
  last sign of life: the last of its stale events, its `ownership_uncertain` events after the
  takeover (no fence, and it ends silence) and any other event after the takeover that carries
  its epoch and its worker (a verification it sends included). Its believed time is the latest
  time believed at or before it in that order, and the episode is quiet when the latest
  believed time of the workflow is at least the quiet period after it. No time: never quiet.
- ordering: `authoritative_seq` when at least one condition's witness was placed after its own
  transition by seq (both carry seq), `arrival` otherwise; for a retry (no transition), when
  both commits of one listed duplicate's witness carry seq (its two earliest commits). In a
  cyclic workflow (no witness) it is defined only when every trigger agrees.
- confidence: high = authoritative ordering and destination confirmation; medium = one of the
  two; low = neither. Destination confirmation: every confirming condition (stale commit, stale
  rejection, duplicate) has a trigger from a destination — for a duplicate, a pair of commits
  both from destinations (a worker's claim of commit is not authoritative) — and there is at
  least one. A finding with only stale_activity needs only the first criterion (decision: the
  waived criterion counts as met, so without seq it is medium).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from detector.contracts.events import OwnershipEvent

QUIET_PERIOD_S = 600.0
CLOCK_SKEW_S = 3600.0

SEVERITY = {"info": 0, "warning": 1, "critical": 2}
STALE_KIND = {
    "progress": ("stale_activity", "info"),
    "heartbeat": ("stale_activity", "info"),
    "effect_attempted": ("stale_effect_attempt", "warning"),
    "effect_committed": ("stale_effect_committed", "critical"),
    "effect_rejected": ("stale_effect_rejected", "warning"),
}
FENCE_KINDS = frozenset({"lease_lost", "lease_released"})
CONFIRMING = frozenset({"stale_effect_committed", "stale_effect_rejected", "duplicate_effect"})

CondKey = tuple[str, str | None, str | None]  # (kind, cause, effect_key)
FKey = tuple[str, str, int]  # (workflow_key, "displaced" | "retry", epoch)


@dataclass(frozen=True, slots=True)
class E:
    """The oracle's view of one (deduplicated) event."""

    event_id: str
    kind: str
    epoch: int
    worker: str
    source: str
    seq: int | None
    key: str | None
    t: float | None
    arrival: int


def before(a: E, b: E) -> bool:
    """DESIGN §4's pairwise order: seq when both carry one (at one seq: an acquisition first,
    then event_id), else arrival."""
    if a.seq is not None and b.seq is not None:
        return (a.seq, tie(a)) < (b.seq, tie(b))
    return a.arrival < b.arrival


def tie(e: E) -> tuple[bool, str]:
    return (e.kind != "lease_acquired", e.event_id)


@dataclass
class OracleFinding:
    """One expected finding. Order-dependent fields are None when the order is cyclic."""

    workflow_key: str
    tag: str  # "displaced" | "retry"
    epoch: int
    triggers: dict[CondKey, list[E]] = field(default_factory=dict)
    # Every event that is an occurrence of a condition: its triggers and, for a duplicate, every
    # commit of its pairs (the latest of them is what a verification must come after).
    occurrences: dict[CondKey, list[E]] = field(default_factory=dict)
    confirmed: dict[CondKey, bool] = field(default_factory=dict)
    stale: list[E] = field(default_factory=list)
    severity: str = "info"
    witness: dict[CondKey, E] | None = None
    current: int | None = None
    transition: E | None = None
    last_stale: E | None = None
    resolved: bool | None = None
    ordering: str | None = None
    confidence: str | None = None
    # Condition -> is its witness placed after the takeover by seq (None without a witness): a
    # finding that lists only some conditions takes its ordering from those.
    placed: dict[CondKey, bool] | None = None

    @property
    def displaced(self) -> int | None:
        return self.epoch if self.tag == "displaced" else None

    @property
    def conditions(self) -> set[CondKey]:
        return set(self.triggers)

    @property
    def witnesses(self) -> dict[CondKey, int | None] | None:
        """Condition -> seq of its earliest witness (the shape the seed test reads)."""
        return None if self.witness is None else {k: e.seq for k, e in self.witness.items()}

    @property
    def effect_keys(self) -> set[str]:
        return {key for _, _, key in self.triggers if key is not None}

    def add(self, cond: CondKey, trigger: E, severity: str, confirmed: bool, *pair: E) -> None:
        self.triggers.setdefault(cond, []).append(trigger)
        self.occurrences.setdefault(cond, []).extend(pair or (trigger,))
        self.confirmed[cond] = self.confirmed.get(cond, False) or confirmed
        if SEVERITY[severity] > SEVERITY[self.severity]:
            self.severity = severity


def oracle(
    events: Iterable[OwnershipEvent],
    *,
    silence: bool = True,
    quiet_period_s: float = QUIET_PERIOD_S,
    clock_skew_s: float = CLOCK_SKEW_S,
) -> dict[FKey, OracleFinding]:
    """Expected final findings of a history fed in this order.

    `silence=True` models `audit` after `finish()`: the quiet period on believed observed_at
    times. With `silence=False` only fences resolve (a run that never measured silence).
    """
    by_wf: dict[str, dict[str, E]] = defaultdict(dict)
    for n, e in enumerate(events):
        seen = by_wf[e.workflow_key]
        if e.event_id not in seen:  # the first arrival of an id wins
            seen[e.event_id] = view(e, n)
    out: dict[FKey, OracleFinding] = {}
    for wf, evmap in by_wf.items():
        w = Workflow(wf, list(evmap.values()), silence, quiet_period_s, clock_skew_s)
        out.update(w.findings())
    return out


def view(e: OwnershipEvent, arrival: int) -> E:
    return E(
        e.event_id,
        e.kind.value,
        e.owner_epoch,
        e.worker_id,
        e.source.value,
        e.seq,
        e.effect_key,
        e.observed_ts(),
        arrival,
    )


def _compare(a: E, b: E) -> int:
    return -1 if before(a, b) else 1


def total_order(events: Sequence[E]) -> list[E] | None:
    """The workflow's events sorted by `before`, or None when `before` has a cycle."""
    if all(e.seq is not None for e in events):
        return sorted(events, key=lambda e: (e.seq, tie(e)))
    if all(e.seq is None for e in events):
        return sorted(events, key=lambda e: e.arrival)
    order = sorted(events, key=functools.cmp_to_key(_compare))
    # `before` is total and antisymmetric: it is an order iff the sort agrees with every pair.
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if not before(a, b):
                return None
    return order


def believed_times(order: Sequence[E], skew: float) -> dict[str, float]:
    """event_id -> believed observed_at time (see the module docstring)."""
    believed: dict[str, float] = {}
    pending: list[tuple[E, float]] = []
    latest: float | None = None
    for x in order:
        if x.t is None:
            continue
        t = x.t
        backing = [
            (y, ty)
            for y, ty in pending
            if (y.worker, y.source) != (x.worker, x.source) and abs(ty - t) <= skew
        ]
        if latest is None or t <= latest + skew or backing:
            for y, ty in [(x, t), *backing]:
                believed[y.event_id] = ty
                latest = ty if latest is None else max(latest, ty)
            pending = [p for p in pending if p not in backing]
        else:
            pending.append((x, t))
    return believed


def disbelieved_count(events: Iterable[OwnershipEvent], skew: float = CLOCK_SKEW_S) -> int:
    """How many times are never believed (per workflow, in its order; cyclic ones skipped)."""
    by_wf: dict[str, dict[str, E]] = defaultdict(dict)
    for n, e in enumerate(events):
        by_wf[e.workflow_key].setdefault(e.event_id, view(e, n))
    total = 0
    for evmap in by_wf.values():
        order = total_order(list(evmap.values())) or []
        timed = sum(1 for e in order if e.t is not None)
        total += timed - len(believed_times(order, skew))
    return total


class Workflow:
    """All findings of one workflow, by brute force over its events."""

    def __init__(
        self, wf: str, events: list[E], silence: bool, quiet_period_s: float, skew: float
    ) -> None:
        self.wf = wf
        self.events = events
        self.acqs = [e for e in events if e.kind == "lease_acquired"]
        self.order = total_order(events)
        self.rank = {e.event_id: i for i, e in enumerate(self.order or ())}
        self.quiet_period_s = quiet_period_s
        self.verifications: dict[str, list[E]] = defaultdict(list)
        for e in events:
            if e.kind == "outcome_verified" and e.source == "verifier" and e.key is not None:
                self.verifications[e.key].append(e)
        self.believed = believed_times(self.order, skew) if self.order and silence else None

    def earliest(self, xs: Iterable[E]) -> E:
        return min(xs, key=lambda e: self.rank[e.event_id])

    def stale(self, e: E) -> bool:
        return any(a.epoch > e.epoch and before(a, e) for a in self.acqs)

    def findings(self) -> dict[FKey, OracleFinding]:
        found: dict[FKey, OracleFinding] = {}

        def finding(tag: str, epoch: int) -> OracleFinding:
            k = (self.wf, tag, epoch)
            if k not in found:
                found[k] = OracleFinding(self.wf, tag, epoch)
            return found[k]

        # Stale evidence: every event against every acquisition.
        for e in self.events:
            if e.kind in STALE_KIND and self.stale(e):
                cond, sev = STALE_KIND[e.kind]
                key = None if cond == "stale_activity" else e.key
                f = finding("displaced", e.epoch)
                f.stale.append(e)
                f.add((cond, None, key), e, sev, e.source == "destination")

        # Duplicates: every pair of commits of one effect key under one epoch, or under two
        # epochs next to each other among those that committed it.
        commits: dict[str, list[E]] = defaultdict(list)
        for e in self.events:
            if e.kind == "effect_committed" and e.key is not None:
                commits[e.key].append(e)
        for key, cs in commits.items():
            committed = sorted({c.epoch for c in cs})
            nxt = dict(pairwise(committed))
            for i, a in enumerate(cs):
                for b in cs[i + 1 :]:
                    later = b if before(a, b) else a
                    both = a.source == "destination" and b.source == "destination"
                    lo, hi = sorted((a.epoch, b.epoch))
                    if lo != hi and nxt[lo] != hi:
                        continue  # an epoch between them committed the key too
                    if a.epoch != b.epoch:
                        f = finding("displaced", min(a.epoch, b.epoch))
                        dup = ("duplicate_effect", "failover", key)
                        f.add(dup, later, "critical", both, a, b)
                    elif a.source == b.source:
                        f = finding("retry", a.epoch)
                        f.add(("duplicate_effect", "retry", key), later, "warning", both, a, b)

        for f in found.values():
            f.ordering = self.ordering_of(f)
            f.confidence = self.confidence(f)
            self.settle(f)
        return found

    def last(self, xs: Iterable[E]) -> E:
        """The member no other member follows; with none (a cycle), the last by seq."""
        members = list(xs)
        top = [x for x in members if not any(before(x, y) for y in members)]
        if top:
            return top[0]
        return max((x for x in members if x.seq is not None), key=lambda e: (e.seq, tie(e)))

    def transitions_of(self, f: OracleFinding, e: E) -> list[E]:
        """The candidates for `e`'s transition: the acquisition of an epoch above the displaced
        one before `e` that no other such acquisition precedes, or, when they make a cycle and
        none is earliest, all of them (the transition is then undefined)."""
        cands = [a for a in self.acqs if a.epoch > f.epoch and before(a, e)]
        first = [a for a in cands if not any(before(b, a) for b in cands)]
        return first or cands

    def transition_of(self, f: OracleFinding, e: E) -> E | None:
        """The earliest acquisition of an epoch above the displaced one before `e`."""
        found = self.transitions_of(f, e)
        return found[0] if len(found) == 1 else None

    def placed_by_seq(self, f: OracleFinding, ck: CondKey, e: E) -> bool:
        if e.seq is None:
            return False
        if f.tag == "retry":  # the two earliest commits of the witness's source
            mine = {c.event_id: c for c in f.occurrences[ck] if c.source == e.source}
            firsts = sorted(mine.values(), key=lambda c: self.rank.get(c.event_id, 0))[:2]
            return all(c.seq is not None for c in firsts)
        tr = self.transition_of(f, e)
        return tr is not None and tr.seq is not None

    def ordering_of(self, f: OracleFinding) -> str | None:
        if self.order is not None:
            f.placed = {
                k: self.placed_by_seq(f, k, self.earliest(ts)) for k, ts in f.triggers.items()
            }
            placed = list(f.placed.values())
        else:  # no witness: defined when every trigger, and every transition it may have, agrees
            if f.tag != "retry" and any(
                e.seq is not None
                and len({a.seq is not None for a in self.transitions_of(f, e)}) > 1
                for ts in f.triggers.values()
                for e in ts
            ):
                return None
            placed = [self.placed_by_seq(f, k, e) for k, ts in f.triggers.items() for e in ts]
        if self.order is None and len(set(placed)) > 1:
            return None
        by_seq = any(placed)
        return "authoritative_seq" if by_seq else "arrival"

    def confidence(self, f: OracleFinding) -> str | None:
        if f.ordering is None:
            return None
        authoritative = f.ordering == "authoritative_seq"
        if all(kind == "stale_activity" for kind, _, _ in f.triggers):
            destination = True  # only activity: the second criterion is waived
        else:
            confirming = [k for k in f.triggers if k[0] in CONFIRMING]
            destination = bool(confirming) and all(f.confirmed[k] for k in confirming)
        return ("low", "medium", "high")[int(authoritative) + int(destination)]

    def settle(self, f: OracleFinding) -> None:
        """The order-dependent fields: witnesses, current, transition, status."""
        latest = self.last(e for ts in f.occurrences.values() for e in ts)
        f.current = max((a.epoch for a in self.acqs if before(a, latest)), default=None)
        if f.stale:
            f.last_stale = self.last(f.stale)
        if self.order is not None:
            f.witness = {k: self.earliest(ts) for k, ts in f.triggers.items()}
            if f.tag == "displaced":
                placed = [k for k in f.witness if f.placed and f.placed[k]]
                firsts = [f.witness[k] for k in placed] or list(f.witness.values())
                first = self.earliest(firsts)
                f.transition = self.transition_of(f, first)
        verified = self.verified(f)
        if not verified or f.tag == "retry" or not f.stale or self.fenced(f):
            f.resolved = verified
        elif self.order is not None:
            f.resolved = self.quiet(f)
        # else: it hinges on silence in a cyclic workflow: not defined

    def fenced(self, f: OracleFinding) -> bool:
        """A fence of the displaced epoch that is not before any of its stale events."""
        for e in self.events:
            if e.epoch != f.epoch:
                continue
            fence = e.kind in FENCE_KINDS or (
                e.kind == "effect_rejected" and e.source == "destination"
            )
            if fence and not any(before(e, s) for s in f.stale):
                return True
        return False

    def quiet(self, f: OracleFinding) -> bool:
        """Silence since the displaced epoch's last sign of life: its stale events and its
        `ownership_uncertain` events after the takeover."""
        if not self.believed or self.order is None:
            return False
        mine = [a for a in self.acqs if a.epoch == f.epoch]
        owner = (self.earliest(mine) if mine else f.stale[0]).worker
        alive = [
            e
            for e in self.events
            if e.epoch == f.epoch
            and e.kind not in STALE_KIND
            and (e.kind == "ownership_uncertain" or e.worker == owner)
            and self.stale(e)
        ]
        anchor = self.last([*f.stale, *alive])
        upto = [
            self.believed[e.event_id]
            for e in self.order[: self.rank[anchor.event_id] + 1]
            if e.event_id in self.believed
        ]
        if not upto:
            return False
        return max(self.believed.values()) - max(upto) >= self.quiet_period_s

    def verified(self, f: OracleFinding) -> bool:
        for (_, _, key), ts in f.occurrences.items():
            if key is None:
                continue
            for t in ts:
                if not any(before(t, v) for v in self.verifications[key]):
                    return False
        return True
