"""The checker: the findings a reader saw on the findings topic, judged against the ground truth.

What the truth says should be found (a *positive*):
- a **stale write**: an effect whose executor no longer owned the work, by the coordination
  system's record at the write; found by a finding of its workflow that displaces that epoch and
  names the key;
- a **duplicate**: a key written again in a workflow where it was written before, by anyone;
  found by a finding of its workflow with a `duplicate_effect` on the key;
- a **stale attempt**: an `effect_attempted` whose executor no longer owned the work, by the same
  record read at the attempt (whether or not an effect followed); found as a stale write is.

A warning or critical finding no positive accounts for is a false positive; an `info` finding (a
displaced owner that only heartbeated) never is. A positive the adapter cannot show by design
(`Write.blind`) is counted apart, never as a miss. So is an owned write a finding calls stale
when the truth marks it heard late (`HEARD_LATE`: without `seq`, arrival put its events after a
takeover that followed it): that finding is then no false positive, and is graded as DESIGN
grades what it heard. Its mirror, a stale write heard before the takeover that displaced it
(`HEARD_EARLY`), is a positive like any blind one: found, a hit; else counted apart. An
explained finding is *misgraded* when its severity, ordering or confidence is not what DESIGN
gives for what the source can show.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, Literal

from detector.contracts.findings import ConditionKind, Finding, Severity
from detector.testing.campaign.truth import HEARD_LATE, UNSENT, Write

# `per_condition`: the source's own events carry seq, some effect calls do not (LangGraph's
# user calls, an etcd attempt made while etcd could not be read), so a finding is ordered by seq
# exactly when it lists a condition that carries one.
Ordering = Literal["authoritative_seq", "arrival", "per_condition"]

_STALE_EFFECT = frozenset(
    {
        ConditionKind.STALE_EFFECT_ATTEMPT,
        ConditionKind.STALE_EFFECT_COMMITTED,
        ConditionKind.STALE_EFFECT_REJECTED,
    }
)


# Issue 34's target for the time from a stale effect to its finding: a found positive slower than
# this is listed (`Verdict.slow`), so that what bounds a p95 above it can be traced.
TARGET_S: Final = 2.0

_CONFIRMED = frozenset(
    {
        ConditionKind.STALE_EFFECT_COMMITTED,
        ConditionKind.STALE_EFFECT_REJECTED,
        ConditionKind.DUPLICATE_EFFECT,
    }
)


@dataclass(frozen=True, slots=True)
class Seen:
    """One revision as a read_committed reader got it, and when (wall clock)."""

    finding: Finding
    at: float


@dataclass(frozen=True, slots=True)
class Positive:
    write: Write
    duplicate: bool  # False: a stale write
    # What DESIGN grades it: a committed stale effect, or a key committed under two epochs, is
    # critical; a refused stale write, or a key committed twice under one epoch, a warning. A
    # write can be both, each in its own finding (`critical_in`).
    critical: bool
    # The findings a duplicate joins (`_episodes`). A stale commit of a key committed before is
    # a failover duplicate too, found in that finding as well: its `episodes` are explained by
    # it, without counting twice.
    episodes: frozenset[int | None] = frozenset()

    @property
    def kind(self) -> str:
        return "duplicate" if self.duplicate else "attempt" if self.write.attempt else "stale"

    def as_duplicate(self) -> Positive:
        across = any(e is not None for e in self.episodes)  # under another epoch: critical
        return Positive(self.write, duplicate=True, critical=across, episodes=self.episodes)

    def found_by(self, finding: Finding) -> bool:
        w = self.write
        if finding.workflow_key != w.workflow_key:
            return False
        if self.duplicate:
            episode = None if finding.displaced is None else finding.displaced.owner_epoch
            return episode in self.episodes and any(
                c.kind is ConditionKind.DUPLICATE_EFFECT and c.effect_key == w.effect_key
                for c in finding.conditions
            )
        return _calls_stale(w, finding)

    def critical_in(self, finding: Finding) -> bool:
        """What DESIGN grades `finding`, which found this positive: a duplicate is critical in a
        failover's episode but a warning in a retry's (`displaced: null`), also when it is a
        stale commit of a key its own epoch had committed before the takeover."""
        return self.critical and not (self.duplicate and finding.displaced is None)


def _calls_stale(w: Write, finding: Finding) -> bool:
    """`finding` displaces `w`'s epoch in its workflow and names its key."""
    displaced = finding.displaced
    if (
        finding.workflow_key != w.workflow_key
        or displaced is None
        or displaced.owner_epoch != w.epoch
    ):
        return False
    return (
        any(c.kind in _STALE_EFFECT and c.effect_key == w.effect_key for c in finding.conditions)
        or w.effect_key in finding.effect_keys
    )


def positives(writes: Iterable[Write]) -> list[Positive]:
    """What the truth says should be found, in the order of the writes."""
    found: list[Positive] = []
    epochs: dict[tuple[int, str, str], set[int]] = defaultdict(set)
    # Of those, the commits whose events reached the detector: a commit a worker's exit
    # silenced (`kills`) cannot decide whose episode a later duplicate joins.
    heard_epochs: dict[tuple[int, str, str], set[int]] = defaultdict(set)
    for w in in_order(writes):
        if w.attempt:
            if not w.owned:
                found.append(Positive(w, duplicate=False, critical=False))
            continue
        key = (w.run, w.workflow_key, w.effect_key)
        before = heard_epochs[key] or epochs[key]
        if not w.owned:
            again = _episodes(w.epoch, before) if w.committed else frozenset()
            found.append(Positive(w, duplicate=False, critical=w.committed, episodes=again))
        elif before and w.committed:
            found.append(
                Positive(
                    w,
                    duplicate=True,
                    critical=bool(before - {w.epoch}),
                    episodes=_episodes(w.epoch, before),
                )
            )
        if w.committed:
            epochs[key].add(w.epoch)
            if w.blind not in UNSENT:
                heard_epochs[key].add(w.epoch)
    return found


def in_order(writes: Iterable[Write]) -> list[Write]:
    """The writes in the order the detector gives them: a workflow's by `seq` where each of its
    writes has one (etcd run 0 of seed 1 in CI: a paused worker recorded its commit after a
    later owner's, and the checker put that owner's duplicate in the wrong episode), else by
    `at`."""
    workflows: dict[tuple[int, str], list[Write]] = defaultdict(list)
    for w in writes:
        workflows[(w.run, w.workflow_key)].append(w)
    ordered: list[Write] = []
    for group in workflows.values():
        if all(w.seq is not None for w in group):
            group.sort(key=lambda w: (w.seq, w.at))
        else:
            group.sort(key=lambda w: w.at)
        ordered += group
    return ordered


def _episodes(epoch: int, before: set[int]) -> frozenset[int | None]:
    """Whose finding a commit under `epoch` of a key committed under `before` joins as a
    duplicate (DESIGN §4): the highest lower epoch's, else its own when only higher ones had
    committed it; a retry's (`displaced: null`, None) when its own had."""
    lower = [e for e in before if e < epoch]
    episodes: set[int | None] = {max(lower)} if lower else ({epoch} if before - {epoch} else set())
    if epoch in before:
        episodes.add(None)
    return frozenset(episodes)


@dataclass(frozen=True, slots=True)
class Grade:
    """What DESIGN gives a finding, for what the source can show."""

    ordering: Ordering
    destination_confirms: bool  # effects are confirmed by a `destination` event

    def ordering_of(self, finding: Finding) -> str:
        if self.ordering != "per_condition":
            return self.ordering
        by_seq = any(c.seq is not None for c in finding.conditions)
        return "authoritative_seq" if by_seq else "arrival"

    def confidence(self, finding: Finding) -> str:
        """A destination confirms a finding's effects when it lists a commit or a rejection:
        one of stale attempts only rests on the worker's word (DESIGN §4)."""
        confirmed = self.destination_confirms and any(
            c.kind in _CONFIRMED for c in finding.conditions
        )
        both = (self.ordering_of(finding) == "authoritative_seq") + confirmed
        return ("low", "medium", "high")[both]


@dataclass(frozen=True, slots=True)
class Slow:
    """A found positive slower than `TARGET_S`."""

    positive: Positive
    latency_s: float


@dataclass
class Verdict:
    """The checker's answer for one source's runs."""

    true_positives: int = 0
    false_negatives: int = 0
    false_positives: int = 0
    misgraded: int = 0
    blind: int = 0
    info_only: int = 0  # findings of activity only: never false positives
    latencies_s: list[float] = field(default_factory=list)
    # Of the writes made while Kafka was down: from the broker's return to the finding (the
    # outage itself holds their events, by design: late, never lost).
    after_outage_s: list[float] = field(default_factory=list)
    # Of the writes in runs without a broker restart: the detector's latency in service, apart
    # from the stall a restart costs it after the broker is back.
    quiet_runs_s: list[float] = field(default_factory=list)
    # One line each, for the report: what was missed, raised for nothing, or misgraded.
    notes: list[str] = field(default_factory=list)
    slow: list[Slow] = field(default_factory=list)

    def timed(
        self, wrote: float, found: float, outages: Sequence[tuple[float, float]], *, quiet: bool
    ) -> None:
        """One found write's latency, also among the quiet runs' or the outages' ones."""
        self.latencies_s.append(max(found - wrote, 0.0))
        if quiet:
            self.quiet_runs_s.append(self.latencies_s[-1])
        back = next((up for down, up in outages if down <= wrote <= up), None)
        if back is not None:
            self.after_outage_s.append(max(found - back, 0.0))


@dataclass
class _Accounts:
    """The findings seen, per workflow, and what the truth accounts for among them."""

    by_workflow: dict[str, list[Seen]]
    declared: Collection[str]  # the source's blind spots
    verdict: Verdict = field(default_factory=Verdict)
    # The findings explained so far, each with whether DESIGN makes it critical.
    critical: dict[str, bool] = field(default_factory=dict)

    def naming(self, w: Write, names: Callable[[Finding], bool]) -> list[Seen]:
        """The warning and critical revisions of `w`'s workflow that `names` accepts, in the
        order they were seen."""
        return [
            s
            for s in self.by_workflow.get(w.workflow_key, ())
            if s.finding.severity is not Severity.INFO and names(s.finding)
        ]

    def explain(self, seen: Iterable[Seen], critical: Callable[[Finding], bool]) -> None:
        """Each of `seen` is accounted for, and critical if `critical` says so of it (DESIGN's
        grade)."""
        for s in seen:
            fid = s.finding.finding_id
            self.critical[fid] = self.critical.get(fid, False) or critical(s.finding)

    def blind(self, w: Write) -> None:
        """`w` counted apart, under a code its source must declare."""
        self.verdict.blind += 1
        if w.blind not in self.declared:
            self.verdict.notes.append(f"blind spot {w.blind!r} not declared by the source")


def check(
    writes: Sequence[Write],
    seen: Sequence[Seen],
    grade: Grade,
    blind: Iterable[str] = (),
    outages: Sequence[tuple[float, float]] = (),
    restarted_runs: Collection[int] = (),
) -> Verdict:
    """Match the truth's positives with the findings seen; latencies from a write to the first
    revision that found it, and for a write inside one of the Kafka `outages` (down, back: wall
    clock) from the broker's return too; `restarted_runs` had a broker restart."""
    latest: dict[str, Seen] = {}
    by_workflow: dict[str, list[Seen]] = defaultdict(list)
    for s in sorted(seen, key=lambda s: (s.at, s.finding.revision)):
        by_workflow[s.finding.workflow_key].append(s)
        prior = latest.get(s.finding.finding_id)
        if prior is None or s.finding.revision > prior.finding.revision:
            latest[s.finding.finding_id] = s
    accounts = _Accounts(by_workflow, frozenset(blind))
    verdict = accounts.verdict
    for p in positives(writes):
        w = p.write
        if not p.duplicate and p.episodes:
            again = p.as_duplicate()
            accounts.explain(accounts.naming(w, again.found_by), again.critical_in)
        found = accounts.naming(w, p.found_by)
        if not found:
            if w.blind is not None and w.blind != HEARD_LATE:
                accounts.blind(w)
                continue
            verdict.false_negatives += 1
            verdict.notes.append(f"missed: {_describe(p)}")
            continue
        verdict.true_positives += 1
        verdict.timed(w.at, found[0].at, outages, quiet=w.run not in restarted_runs)
        if found[0].at - w.at > TARGET_S:
            verdict.slow.append(Slow(p, found[0].at - w.at))
        # Every finding naming it is explained by it, not only the first: one key written
        # again after two displaced epochs is a duplicate of each (a finding per epoch).
        accounts.explain(found, p.critical_in)
    # Heard after the takeover that followed them: the findings calling them stale are what
    # DESIGN gives for arrival (critical for a commit), neither hits nor false alarms.
    for w in (w for w in writes if w.blind == HEARD_LATE and w.owned):
        if late := accounts.naming(w, partial(_calls_stale, w)):
            accounts.blind(w)
            accounts.explain(late, Positive(w, duplicate=False, critical=w.committed).critical_in)
    for fid, s in latest.items():
        f = s.finding
        if f.severity is Severity.INFO:
            verdict.info_only += 1
            continue
        if fid not in accounts.critical:
            verdict.false_positives += 1
            verdict.notes.append(
                f"false alarm: {f.severity} {f.workflow_key} displaced "
                f"{f.displaced.owner_epoch if f.displaced else None} "
                f"({', '.join(sorted({c.kind.value for c in f.conditions}))})"
            )
            continue
        wrong = _misgrading(f, accounts.critical[fid], grade)
        if wrong:
            verdict.misgraded += 1
            verdict.notes.append(f"misgraded {f.workflow_key}: {wrong}")
    return verdict


def _misgrading(f: Finding, critical: bool, grade: Grade) -> str:
    """What differs from DESIGN's grade ('' when nothing does)."""
    wrong = []
    want = Severity.CRITICAL if critical else Severity.WARNING
    if f.severity is not want:
        wrong.append(f"severity {f.severity} (want {want})")
    ordering = grade.ordering_of(f)
    if f.ordering != ordering:
        wrong.append(f"ordering {f.ordering} (want {ordering})")
    confidence = "medium" if f.evidence_truncated and grade.confidence(f) == "high" else None
    want_confidence = confidence or grade.confidence(f)
    if f.confidence != want_confidence:
        wrong.append(f"confidence {f.confidence} (want {want_confidence})")
    return "; ".join(wrong)


def _describe(p: Positive) -> str:
    w = p.write
    what = "duplicate of" if p.duplicate else f"stale {'attempt' if w.attempt else 'write'} of"
    return (
        f"run {w.run} {w.workflow_key}: {what} {w.effect_key} by {w.executor} epoch {w.epoch} "
        f"({w.evidence})"
    )
