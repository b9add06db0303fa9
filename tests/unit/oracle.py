"""A brute-force oracle for DESIGN §4, written from the text alone (it does not use detector.core).

It needs a `seq` on every event and compares every pair of events of a workflow, in seq order:

- an event of epoch e that comes after the acquisition of some epoch e' > e is stale; its kind
  decides the condition (progress/heartbeat → stale_activity, effect_attempted → attempt,
  effect_committed → committed, effect_rejected → rejected; lease_lost, lease_released,
  ownership_uncertain and outcome_verified are never conditions);
- an effect key committed under e and under e' > e is a failover duplicate in the finding of e,
  witnessed by the later of the two commits;
- an effect key committed twice under one epoch by the same source (distinct event ids) is a retry
  duplicate, a finding of its own, witnessed by the second commit.

Each condition keeps its earliest witness. A finding is resolved when the displaced epoch is
fenced (its own lease_lost/lease_released after its last stale event, or a destination's rejection
of it that is or follows its last stale event; vacuous when it never acted after the takeover, and
for retry findings) and every effect key of the finding is verified by a verifier after the latest
condition on that key. The quiet period is not modelled (histories carry no caller time).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from detector.events import OwnershipEvent

SEVERITY = {"info": 0, "warning": 1, "critical": 2}
STALE_KIND = {
    "progress": ("stale_activity", "info"),
    "heartbeat": ("stale_activity", "info"),
    "effect_attempted": ("stale_effect_attempt", "warning"),
    "effect_committed": ("stale_effect_committed", "critical"),
    "effect_rejected": ("stale_effect_rejected", "warning"),
}
FENCE_KINDS = {"lease_lost", "lease_released"}

CondKey = tuple[str, str | None, str | None]  # (kind, cause, effect_key)


@dataclass
class OracleFinding:
    workflow_key: str
    displaced: int | None  # None for a retry finding
    retry_epoch: int | None  # the epoch of a retry finding
    witnesses: dict[CondKey, int] = field(default_factory=dict)  # condition -> earliest seq
    severity: str = "info"
    current: int | None = None
    last_stale_seq: int | None = None
    resolved: bool = False

    @property
    def conditions(self) -> set[CondKey]:
        return set(self.witnesses)

    def add(self, cond: CondKey, seq: int, severity: str) -> None:
        old = self.witnesses.get(cond)
        if old is None or seq < old:
            self.witnesses[cond] = seq
        if SEVERITY[severity] > SEVERITY[self.severity]:
            self.severity = severity


def _kind(e: OwnershipEvent) -> str:
    return e.kind.value


def oracle(events: Iterable[OwnershipEvent]) -> dict[tuple[str, str, int], OracleFinding]:
    """Findings keyed by (workflow_key, "displaced" | "retry", epoch)."""
    by_wf: dict[str, dict[str, OwnershipEvent]] = defaultdict(dict)
    for e in events:
        assert e.seq is not None, "the oracle needs a seq on every event"
        by_wf[e.workflow_key].setdefault(e.event_id, e)  # a redelivery is the same event
    out: dict[tuple[str, str, int], OracleFinding] = {}
    for wf, evmap in by_wf.items():
        out.update(_workflow(wf, sorted(evmap.values(), key=lambda e: (e.seq, e.event_id))))
    return out


def _workflow(wf: str, hist: list[OwnershipEvent]) -> dict[tuple[str, str, int], OracleFinding]:
    acqs = [e for e in hist if _kind(e) == "lease_acquired"]
    found: dict[tuple[str, str, int], OracleFinding] = {}

    def finding(tag: str, epoch: int) -> OracleFinding:
        k = (wf, tag, epoch)
        if k not in found:
            found[k] = OracleFinding(
                wf, epoch if tag == "displaced" else None, epoch if tag == "retry" else None
            )
        return found[k]

    def taken_over(e: OwnershipEvent) -> bool:
        return any(a.owner_epoch > e.owner_epoch and a.seq < e.seq for a in acqs)  # type: ignore[operator]

    # Stale evidence: every event against every acquisition.
    for e in hist:
        if _kind(e) in STALE_KIND and taken_over(e):
            cond, sev = STALE_KIND[_kind(e)]
            key = e.effect_key if cond != "stale_activity" else None
            f = finding("displaced", e.owner_epoch)
            f.add((cond, None, key), e.seq, sev)  # type: ignore[arg-type]
            f.last_stale_seq = max(f.last_stale_seq or -1, e.seq)  # type: ignore[type-var]

    # Duplicates: every pair of commits of one effect key.
    commits = [e for e in hist if _kind(e) == "effect_committed"]
    for i, a in enumerate(commits):
        for b in commits[i + 1 :]:
            if a.effect_key != b.effect_key or a.event_id == b.event_id:
                continue
            later = max(a.seq, b.seq)  # type: ignore[type-var]
            if a.owner_epoch != b.owner_epoch:
                low = min(a.owner_epoch, b.owner_epoch)
                finding("displaced", low).add(
                    ("duplicate_effect", "failover", a.effect_key), later, "critical"
                )
            elif a.source == b.source:
                finding("retry", a.owner_epoch).add(
                    ("duplicate_effect", "retry", a.effect_key), later, "warning"
                )

    for f in found.values():
        # the latest evidence: the last witness, or a later repeat of a stale condition
        latest = max([*f.witnesses.values(), f.last_stale_seq or 0])
        f.current = max((a.owner_epoch for a in acqs if a.seq < latest), default=None)  # type: ignore[operator]
        f.resolved = _fenced(f, hist) and _verified(f, hist)
    return found


def _fenced(f: OracleFinding, hist: list[OwnershipEvent]) -> bool:
    if f.displaced is None or f.last_stale_seq is None:
        return True
    last = f.last_stale_seq
    for e in hist:
        if e.owner_epoch != f.displaced:
            continue
        if _kind(e) in FENCE_KINDS and e.seq > last:  # type: ignore[operator]
            return True
        # a destination's rejection shows the fence holds, even when it is the last stale event
        if (
            _kind(e) == "effect_rejected" and e.source.value == "destination" and e.seq >= last  # type: ignore[operator]
        ):
            return True
    return False


def _verified(f: OracleFinding, hist: list[OwnershipEvent]) -> bool:
    latest: dict[str, int] = {}
    for (_, _, key), seq in f.witnesses.items():
        if key is not None:
            latest[key] = max(latest.get(key, -1), seq)
    return all(
        any(
            _kind(e) == "outcome_verified"
            and e.source.value == "verifier"
            and e.effect_key == key
            and e.seq > seq  # type: ignore[operator]
            for e in hist
        )
        for key, seq in latest.items()
    )
