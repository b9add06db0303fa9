"""What the bridge knows and what each sink must be told: pure, no Kafka, HTTP or clock.

The bridge feeds it finding revisions (`observe`) and the state it restored (`restore`); `plan`
says, for each finding that changed, what each sink must be sent so that it shows the finding's
latest revision; `done` records a sink's answer. Sinks are told only about changes they show:

- Alertmanager: every new revision of an open finding is fired (its annotations may have
  changed); a change of the labels (`severity`, `condition`) also ends the alert under the old
  labels, which Alertmanager would otherwise keep firing; a resolution is sent with `endsAt`.
  Alertmanager forgets an alert that is not sent again, so the bridge also re-sends every open
  finding on an interval (`resend`), which is not a change and not planned here.
- PagerDuty: `trigger` when a finding opens, escalates or reopens; `resolve` when it resolves.
  A revision that changes neither severity nor status sends nothing.
- The webhook: every new revision.

A sink hears of a finding only once its severity reaches the sink's minimum; a finding first seen
already resolved is announced nowhere (there is nothing to resolve). Entries of resolved findings
are kept for a retention (the findings topic's), so that an older revision read again — offsets
reset, a replay — is recognised as old instead of announcing the finding again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from detector.contracts.findings import ConditionKind, Finding, Severity, Status
from detector.contracts.page_state import PageStateRecord, Sent, SentOutcome, SinkName

# DESIGN §4: the conditions in rising severity. An alert is labelled with the highest one.
CONDITION_ORDER: Final = (
    ConditionKind.STALE_ACTIVITY,
    ConditionKind.STALE_EFFECT_REJECTED,
    ConditionKind.STALE_EFFECT_ATTEMPT,
    ConditionKind.STALE_EFFECT_COMMITTED,
    ConditionKind.DUPLICATE_EFFECT,
)
# The `severity` label of the alerting rules (docs/operating/alerts.md), so that one
# Alertmanager route serves both: critical pages, warning makes a ticket, info is worth knowing.
ALERT_SEVERITY: Final = {
    Severity.CRITICAL: "page",
    Severity.WARNING: "ticket",
    Severity.INFO: "warning",
}


class Action(StrEnum):
    FIRE = "fire"  # Alertmanager: the alert under the finding's labels is firing
    TRIGGER = "trigger"  # PagerDuty
    POST = "post"  # the webhook: this revision
    RESOLVE = "resolve"  # Alertmanager (endsAt) and PagerDuty


def condition_of(finding: Finding) -> str:
    """The finding's highest condition kind (`none` for a finding that lists none)."""
    kinds = {c.kind for c in finding.conditions}
    top = [k for k in CONDITION_ORDER if k in kinds]
    return top[-1].value if top else "none"


@dataclass(frozen=True, slots=True)
class SinkPolicy:
    min_severity: Severity = Severity.INFO

    def wants(self, finding: Finding) -> bool:
        return finding.severity.rank >= self.min_severity.rank


@dataclass(slots=True)
class Entry:
    """One finding as the bridge knows it: the state record, and the partition it lives in."""

    finding: Finding
    partition: int
    first_seen: datetime
    revision_at: datetime
    sent: dict[SinkName, Sent] = field(default_factory=dict)

    @property
    def finding_id(self) -> str:
        return self.finding.finding_id

    @property
    def open(self) -> bool:
        return self.finding.status is Status.OPEN

    def record(self) -> PageStateRecord:
        return PageStateRecord(
            finding=self.finding,
            first_seen_at=self.first_seen,
            revision_at=self.revision_at,
            sent=dict(self.sent),
        )

    @classmethod
    def of(cls, record: PageStateRecord, partition: int) -> Entry:
        return cls(
            record.finding, partition, record.first_seen_at, record.revision_at, dict(record.sent)
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message for one sink about one revision, with what that sink last took."""

    sink: SinkName
    action: Action
    finding: Finding
    partition: int
    first_seen: datetime
    revision_at: datetime
    previous: Sent | None

    @property
    def finding_id(self) -> str:
        return self.finding.finding_id


def decide(entry: Entry, sink: SinkName, policy: SinkPolicy) -> Action | None:
    """What `sink` must be sent so that it shows `entry`'s latest revision; None: nothing."""
    f, prev = entry.finding, entry.sent.get(sink)
    announced = prev is not None and prev.status is Status.OPEN
    if f.status is Status.RESOLVED:
        if not announced:
            return None  # never announced (or resolved already): nothing to resolve
        if sink is SinkName.WEBHOOK:
            return Action.POST
        return Action.RESOLVE
    if not policy.wants(f):
        return None
    if prev is None or not announced:
        return Action.FIRE if sink is SinkName.ALERTMANAGER else _open(sink)
    if prev.revision >= f.revision:
        return None
    if sink is SinkName.PAGERDUTY:
        # Only on change: a new revision at the same severity shows nothing new on the incident.
        return Action.TRIGGER if f.severity.rank > prev.severity.rank else None
    return _open(sink)


def _open(sink: SinkName) -> Action:
    return {
        SinkName.ALERTMANAGER: Action.FIRE,
        SinkName.PAGERDUTY: Action.TRIGGER,
        SinkName.WEBHOOK: Action.POST,
    }[sink]


class PageState:
    """Every finding of the assigned partitions, and which of them need planning or saving."""

    def __init__(self, policies: Mapping[SinkName, SinkPolicy]) -> None:
        self.policies = dict(policies)
        self.entries: dict[str, Entry] = {}
        self._dirty: set[str] = set()  # changed since the last plan
        self._unsaved: dict[str, int] = {}  # finding id -> partition: to write to the state topic

    # ---- input --------------------------------------------------------------------------------

    def restore(self, record: PageStateRecord, partition: int) -> None:
        """A record read back from the state topic. Planned again: whatever a sink had not
        taken when it was written is sent now."""
        fid = record.finding.finding_id
        self.entries[fid] = Entry.of(record, partition)
        self._dirty.add(fid)

    def forget(self, finding_id: str) -> None:
        """A tombstone read back from the state topic."""
        self.entries.pop(finding_id, None)
        self._dirty.discard(finding_id)

    def observe(self, finding: Finding, partition: int, at: datetime) -> bool:
        """A revision read from the findings topic, with its Kafka timestamp; False when it is
        not newer than the one known (a redelivery, or an older revision read again)."""
        fid = finding.finding_id
        known = self.entries.get(fid)
        if known is not None and known.finding.revision >= finding.revision:
            return False
        if known is None:
            self.entries[fid] = Entry(finding, partition, at, at)
        else:
            known.finding, known.partition, known.revision_at = finding, partition, at
        self._dirty.add(fid)
        self._unsaved[fid] = partition
        return True

    # ---- decisions ----------------------------------------------------------------------------

    def plan(self) -> list[Delivery]:
        """What each sink must be sent for the findings changed since the last plan."""
        out: list[Delivery] = []
        for fid in sorted(self._dirty):
            entry = self.entries[fid]
            for sink, policy in self.policies.items():
                action = decide(entry, sink, policy)
                if action is not None:
                    out.append(
                        Delivery(
                            sink,
                            action,
                            entry.finding,
                            entry.partition,
                            entry.first_seen,
                            entry.revision_at,
                            entry.sent.get(sink),
                        )
                    )
        self._dirty.clear()
        return out

    def done(self, delivery: Delivery, outcome: SentOutcome, at: datetime) -> None:
        """The sink took the delivery (or refused it for good: a dead letter)."""
        entry = self.entries.get(delivery.finding_id)
        if entry is None:
            return  # forgotten meanwhile (its partition was revoked)
        f = delivery.finding
        entry.sent[delivery.sink] = Sent(
            revision=f.revision,
            status=f.status,
            severity=f.severity,
            condition=condition_of(f),
            outcome=outcome,
            at=at,
        )
        self._unsaved[entry.finding_id] = entry.partition

    def resend(self, sink: SinkName) -> list[Entry]:
        """The open findings `sink` took at their latest revision: what Alertmanager must be
        sent again so that it does not time them out. A finding with a change still to deliver
        is left to that delivery, and one the sink refused is not sent again until it changes."""
        out = []
        for entry in self.entries.values():
            sent = entry.sent.get(sink)
            if (
                entry.open
                and sent is not None
                and sent.outcome == "accepted"
                and sent.status is Status.OPEN
                and sent.revision == entry.finding.revision
                and entry.finding_id not in self._dirty
            ):
                out.append(entry)
        return out

    def expire(self, now: datetime, retention: timedelta) -> list[tuple[str, int]]:
        """Forget resolved findings whose resolution is older than `retention` and that no sink
        still has to hear about; their (finding id, partition), for tombstones."""
        gone = []
        for fid, entry in list(self.entries.items()):
            if (
                not entry.open
                and fid not in self._dirty
                and entry.revision_at + retention <= now
                and not any(decide(entry, s, p) for s, p in self.policies.items())
            ):
                del self.entries[fid]
                self._unsaved[fid] = entry.partition
                gone.append((fid, entry.partition))
        return gone

    def drop_partitions(self, partitions: Iterable[int]) -> None:
        """The partitions were revoked: their findings are another bridge's now."""
        revoked = set(partitions)
        for fid, entry in list(self.entries.items()):
            if entry.partition in revoked:
                del self.entries[fid]
                self._dirty.discard(fid)
        self._unsaved = {f: p for f, p in self._unsaved.items() if p not in revoked}

    # ---- output -------------------------------------------------------------------------------

    def take_unsaved(self) -> list[tuple[str, int, PageStateRecord | None]]:
        """What to write to the state topic: each changed finding's record, or None (a
        tombstone) for one forgotten; cleared once taken."""
        out = []
        for fid, partition in self._unsaved.items():
            entry = self.entries.get(fid)
            out.append((fid, partition, None if entry is None else entry.record()))
        self._unsaved.clear()
        return out

    @property
    def unsaved(self) -> bool:
        return bool(self._unsaved)

    def open_counts(self) -> Counter[Severity]:
        return Counter(e.finding.severity for e in self.entries.values() if e.open)
