"""Prometheus metrics of a detector worker.

Every label is bounded (event kind, severity, status, reason code, optional field name,
eviction cause, partition number, and the lease-health labels tool_class, model and provider,
capped by `LabelBounds`); workflow keys, worker ids and effect keys never become labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import accumulate
from threading import Lock
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily, Metric

from detector.contracts.dead_letters import REASON_CODES
from detector.contracts.events import OPTIONAL_FIELDS, OwnershipEvent
from detector.contracts.findings import Severity
from detector.core import (
    Counters,
    FindingStats,
    FindingUpdate,
    LabelBounds,
    LeaseHealth,
    LeaseStats,
    Observations,
)

# Label of each class of forgotten evidence, and the engine counter that counts it.
_EVIDENCE_CLASSES: Final = {
    "activity": "activity_dropped",
    "event": "events_dropped",
    "effect": "effects_dropped",
    "acquisition": "acquisitions_dropped",
    "event_id": "ids_dropped",
}


_LEASE_LABELS: Final = list(LabelBounds.NAMES)
Labels = tuple[str, ...]


class _EngineHistogram:
    """A histogram of observations an engine made and counted per bucket (`LeaseStats`): the
    counts are added here a tick at a time, where prometheus_client's Histogram only observes."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        bounds: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._les = [repr(float(b)) for b in bounds] + ["+Inf"]  # as Histogram writes them
        # labels -> (count per bucket, sum)
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}
        self._lock = Lock()  # collect() runs in the /metrics server's thread
        registry.register(self)

    def add(self, labels: Labels, counts: Sequence[int], total: float) -> None:
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = ([0] * len(self._les), [0.0])
            buckets, sums = series
            for i, count in enumerate(counts):
                buckets[i] += count
            sums[0] += total

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [
                (labels, list(accumulate(buckets)), sums[0])
                for labels, (buckets, sums) in self._series.items()
            ]
        family = self._family()
        for labels, cumulative, total in sorted(rows):
            family.add_metric(list(labels), list(zip(self._les, cumulative, strict=True)), total)
        yield family


@dataclass(frozen=True, slots=True)
class _LeaseSeen:
    """One label set's cumulative lease-health counts, as a partition's engine last had them."""

    heartbeat_age: tuple[int, ...]
    heartbeat_age_sum: float
    remaining: tuple[int, ...]
    remaining_sum: float
    expired: int
    reclaimed: int
    lost: int
    uncertain: int
    takeover_delay: tuple[int, ...] = (0,) * (len(LeaseStats.TAKEOVER_DELAY_BOUNDS) + 1)
    takeover_delay_sum: float = 0.0
    early: int = 0

    @classmethod
    def of(cls, stats: LeaseStats) -> _LeaseSeen:
        return cls(
            tuple(stats.heartbeat_age),
            stats.heartbeat_age_sum,
            tuple(stats.remaining),
            stats.remaining_sum,
            stats.expired,
            stats.reclaimed,
            stats.lost,
            stats.uncertain,
            tuple(stats.takeover_delay),
            stats.takeover_delay_sum,
            stats.early,
        )


_NOTHING_SEEN: Final = _LeaseSeen(
    (0,) * (len(LeaseStats.HEARTBEAT_AGE_BOUNDS) + 1),
    0.0,
    (0,) * (len(LeaseStats.REMAINING_BOUNDS) + 1),
    0.0,
    0,
    0,
    0,
    0,
)


def _minus(now: Sequence[int], then: Sequence[int]) -> list[int]:
    return [a - b for a, b in zip(now, then, strict=True)]


class WorkerMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, max_label_values: int | None = None
    ) -> None:
        """`max_label_values` caps the distinct values of each lease-health label across the
        worker's partitions (each engine caps its own too); default `LabelBounds`'s."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "splitbrain_events_total", "Valid events processed", ["kind"], registry=r
        )
        self.dlq = Counter(
            "splitbrain_dlq_messages_total",
            "Input records sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.revisions = Counter(
            "splitbrain_finding_revisions_total",
            "Finding revisions published",
            ["severity", "status"],
            registry=r,
        )
        self.opened = Counter(
            "splitbrain_findings_opened_total",
            "Split-brain findings opened (first revision)",
            ["severity"],
            registry=r,
        )
        self.escalated = Counter(
            "splitbrain_findings_escalated_total",
            "Findings that reached a severity: opened at it, or raised to it (a finding opened "
            "at info and raised to critical counts once at each)",
            ["severity"],
            registry=r,
        )
        self.open_findings = Gauge(
            "splitbrain_findings_open",
            "Published findings still open, by input partition and severity (every 5 s)",
            ["partition", "severity"],
            registry=r,
        )
        self.field_drops = Counter(
            "splitbrain_event_fields_dropped_total",
            "Invalid optional fields dropped from events that were processed without them "
            "(never dead-lettered for it), by field",
            ["field"],
            registry=r,
        )
        self.workflows = Gauge(
            "splitbrain_state_workflows", "Workflows tracked in memory", ["partition"], registry=r
        )
        self.dropped = Counter(
            "splitbrain_state_evidence_dropped_total",
            "Retained evidence forgotten at the per-workflow caps, by class: raw activity and "
            "other raw events (routine), effect keys, acquisitions and event ids (these can "
            "hide a finding: the workflow counts as truncated)",
            ["class"],
            registry=r,
        )
        self.redelivered = Counter(
            "splitbrain_events_redelivered_total",
            "Events ignored because their event_id was already seen",
            registry=r,
        )
        self.id_conflicts = Counter(
            "splitbrain_events_id_conflicts_total",
            "Events ignored because their event_id was already seen with other content",
            registry=r,
        )
        self.truncated = Counter(
            "splitbrain_workflows_truncated_total",
            "Workflows whose effect keys or acquisitions a cap forgot: a finding may be missed "
            "or incomplete there, and its revisions say evidence_truncated",
            registry=r,
        )
        self.engine_errors = Counter(
            "splitbrain_engine_errors_total",
            "Events the engine raised an exception on: each went to the dead-letter topic with "
            "the error's class and traceback hash, and its workflow's later findings say "
            "evidence_truncated (detection there is degraded)",
            registry=r,
        )
        self.evictions = Counter(
            "splitbrain_state_evictions_total", "Workflow states evicted", ["cause"], registry=r
        )
        self.transactions = Counter(
            "splitbrain_transactions_total",
            "Kafka transactions by outcome",
            ["outcome"],
            registry=r,
        )
        self.commit_seconds = Histogram(
            "splitbrain_transaction_commit_seconds",
            "Time to send offsets and commit a transaction",
            registry=r,
        )
        self.batch_events = Histogram(
            "splitbrain_transaction_events",
            "Input records per committed transaction",
            buckets=(1, 10, 100, 500, 1000, 5000, 20000),
            registry=r,
        )
        self.lag = Gauge(
            "splitbrain_consumer_lag_records",
            "Input records of an assigned partition not processed yet (its end offset as last "
            "fetched minus the next offset to process)",
            ["partition"],
            registry=r,
        )
        self.last_poll = Gauge(
            "splitbrain_worker_last_poll_timestamp_seconds",
            "Unix time at which the worker last polled its input; a hung worker stops it",
            registry=r,
        )
        self.restore_seconds = Histogram(
            "splitbrain_state_restore_seconds",
            "Time to restore partitions from the changelog",
            registry=r,
        )
        self.restore_records = Counter(
            "splitbrain_state_restore_records_total",
            "Changelog records read by restores (a standby's takeover reads only the tail)",
            registry=r,
        )
        self.standby_lag_records = Gauge(
            "splitbrain_standby_lag_records",
            "Changelog records of a partition kept warm (--standby) not applied yet: its high "
            "watermark as last fetched minus the next offset to apply",
            ["partition"],
            registry=r,
        )
        # Lease health, from the ownership events of any emitter (`LeaseStats`): observed by
        # the engines, which subtract emitters' clocks for health only, and exported every 5 s.
        self.heartbeat_age = _EngineHistogram(
            "splitbrain_lease_heartbeat_age_seconds",
            "Age of a workflow's last heartbeat (or of its acquisition) when the next heartbeat "
            "of its current owner arrives: the heartbeat gap, on the emitter's observed_at",
            _LEASE_LABELS,
            LeaseStats.HEARTBEAT_AGE_BOUNDS,
            r,
        )
        self.lease_remaining = _EngineHistogram(
            "splitbrain_lease_remaining_seconds",
            "Lease time left when a heartbeat of the current owner arrives: the lease_until of "
            "its epoch's previous acquisition or heartbeat minus this heartbeat's observed_at "
            "(0 and below: the heartbeat came after the lease ran out)",
            _LEASE_LABELS,
            LeaseStats.REMAINING_BOUNDS,
            r,
        )
        self.leases_expired = Counter(
            "splitbrain_leases_expired_total",
            "Takeovers of a workflow whose previous epoch had not released its lease: the "
            "lease expired (or was broken) while its owner held it",
            _LEASE_LABELS,
            registry=r,
        )
        self.extension_failures = Counter(
            "splitbrain_lease_extension_failures_total",
            "Lease extensions that failed, by reason: lost (lease_lost or heartbeat_lost: the "
            "owner knows it is displaced) or uncertain (ownership_uncertain: the coordination "
            "store did not answer)",
            [*_LEASE_LABELS, "reason"],
            registry=r,
        )
        self.jobs_reclaimed = Counter(
            "splitbrain_jobs_reclaimed_total",
            "Acquisitions of a workflow by a new epoch after an earlier one (not its first)",
            _LEASE_LABELS,
            registry=r,
        )
        self.takeover_delay = _EngineHistogram(
            "splitbrain_takeover_delay_seconds",
            "Takeovers after the displaced epoch's lease ran out: the new acquisition's "
            "observed_at minus the displaced epoch's last known lease_until (its acquisition's "
            "or latest heartbeat's), how long the workflow went without a live owner",
            _LEASE_LABELS,
            LeaseStats.TAKEOVER_DELAY_BOUNDS,
            r,
        )
        self.takeovers_early = Counter(
            "splitbrain_takeovers_early_total",
            "Takeovers observed before the displaced epoch's last known lease_until: a lease "
            "broken while still valid (or the coordinator's clocks disagree); not in "
            "splitbrain_takeover_delay_seconds",
            _LEASE_LABELS,
            registry=r,
        )
        # Findings over their life (`FindingStats`), observed by the engines once per change of
        # a finding's status and exported every 5 s, by the severity of the resolving revision.
        self.zombie_seconds = _EngineHistogram(
            "splitbrain_zombie_activity_seconds",
            "When a finding resolves: how long its displaced owner went on acting after the "
            "takeover, its last stale event's observed_at minus the transition's (the "
            "resolving revision's evidence_lag.seconds)",
            ["severity"],
            FindingStats.ZOMBIE_SECONDS_BOUNDS,
            r,
        )
        self.zombie_seq = _EngineHistogram(
            "splitbrain_zombie_activity_seq",
            "When a finding with authoritative ordering resolves: its last stale event's seq "
            "minus the transition's (evidence_lag.seq), positions in the workflow's order",
            ["severity"],
            FindingStats.ZOMBIE_SEQ_BOUNDS,
            r,
        )
        self.resolution_seconds = _EngineHistogram(
            "splitbrain_finding_resolution_seconds",
            "Time from a finding's opening (or reopening) revision to its resolving revision, on "
            "the worker's clock",
            ["severity"],
            FindingStats.RESOLUTION_BOUNDS,
            r,
        )
        self.oldest_open = Gauge(
            "splitbrain_findings_open_oldest_age_seconds",
            "Age of the oldest published finding still open, by input partition and severity, "
            "on the worker's clock since it went open; 0 when none is open (every 5 s)",
            ["partition", "severity"],
            registry=r,
        )
        self._finding_seen: dict[int, dict[tuple[str, str], tuple[tuple[int, ...], float]]] = {}
        # At 0 from the start, as the counters below: a first observation shows in rate().
        for histogram, bounds in (
            (self.zombie_seconds, FindingStats.ZOMBIE_SECONDS_BOUNDS),
            (self.zombie_seq, FindingStats.ZOMBIE_SEQ_BOUNDS),
            (self.resolution_seconds, FindingStats.RESOLUTION_BOUNDS),
        ):
            for severity in Severity:
                histogram.add((severity.value,), [0] * (len(bounds) + 1), 0.0)
        self._lease_labels = (
            LabelBounds() if max_label_values is None else LabelBounds(max_label_values)
        )
        self._lease_seen: dict[int, dict[tuple[str, str, str], _LeaseSeen]] = {}
        # Known label values start at 0: a series that first appears at 1 shows no increase(),
        # so an alert on it would miss the first critical finding after every start.
        for severity in Severity:
            self.opened.labels(severity.value)
            self.escalated.labels(severity.value)
        for outcome in ("committed", "aborted"):
            self.transactions.labels(outcome)
        for reason in REASON_CODES:
            self.dlq.labels(reason)
        for name in OPTIONAL_FIELDS:
            self.field_drops.labels(name)
        for evidence_class in _EVIDENCE_CLASSES:
            self.dropped.labels(evidence_class)
        self._seen: dict[int, Counters] = {}
        # Work of open transactions, by input partition: counted when its transaction commits,
        # dropped when it aborts, so the counters agree with what read_committed readers see
        # (an aborted batch is processed again, and would otherwise be counted twice). A
        # runtime's `Checkpoint` (detector.runtime.checkpoint) says which, as it ends.
        self._pending: dict[int, dict[tuple[Counter, tuple[str, ...]], int]] = {}
        # The trace id of the latest finding span behind each pending finding count, added to
        # it as an OpenMetrics exemplar `{trace_id="…"}` when it is counted.
        self._exemplars: dict[int, dict[tuple[Counter, tuple[str, ...]], str]] = {}

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Expose /metrics on `address` (loopback unless told otherwise)."""
        start_http_server(port, addr=address, registry=self.registry)

    def _count(self, partition: int, counter: Counter, *labels: str) -> None:
        pending = self._pending.setdefault(partition, {})
        pending[(counter, labels)] = pending.get((counter, labels), 0) + 1

    def event(self, kind: str, partition: int) -> None:
        self._count(partition, self.events, kind)

    def dead_letter(self, reason: str, partition: int) -> None:
        self._count(partition, self.dlq, reason)

    def engine_error(self, partition: int) -> None:
        self._count(partition, self.engine_errors)

    def fields_dropped(self, event: OwnershipEvent, partition: int) -> None:
        """Count the optional fields `admit` dropped from an event it kept (none: no work)."""
        for drop in event.dropped_fields:
            self._count(partition, self.field_drops, drop.field)

    def finding_revision(
        self, update: FindingUpdate, partition: int, trace_id: str | None = None
    ) -> None:
        """`trace_id`: of the revision's span (`detector.telemetry.tracing`), as an exemplar."""
        finding = update.finding
        severity = finding.severity.value
        counted: list[tuple[Counter, tuple[str, ...]]] = [
            (self.revisions, (severity, finding.status.value))
        ]
        if finding.revision == 1:
            counted.append((self.opened, (severity,)))
        if update.escalated:
            counted.append((self.escalated, (severity,)))
        for counter, labels in counted:
            self._count(partition, counter, *labels)
            if trace_id is not None:
                self._exemplars.setdefault(partition, {})[(counter, labels)] = trace_id

    def state(self, partition: int, workflows: int) -> None:
        self.workflows.labels(str(partition)).set(workflows)

    def findings_open(self, partition: int, counts: Mapping[Severity, int] | None) -> None:
        """None: the partition is not ours (any more)."""
        for severity in Severity:
            if counts is None:
                self.open_findings.remove(str(partition), severity.value)
            else:
                self.open_findings.labels(str(partition), severity.value).set(counts[severity])

    def polled(self, unix_seconds: float) -> None:
        self.last_poll.set(unix_seconds)

    def consumer_lag(self, partition: int, records: int | None) -> None:
        """None: the partition is not ours (any more), or its end is not known yet."""
        _records_behind(self.lag, partition, records)

    def engine(self, partition: int, counters: Counters) -> None:
        """Turn one partition engine's cumulative counts into counter increments."""
        last = self._seen.get(partition) or Counters()
        for evidence_class, name in _EVIDENCE_CLASSES.items():
            self.dropped.labels(evidence_class).inc(getattr(counters, name) - getattr(last, name))
        self.truncated.inc(counters.workflows_truncated - last.workflows_truncated)
        self.redelivered.inc(counters.redelivered - last.redelivered)
        self.id_conflicts.inc(counters.id_conflicts - last.id_conflicts)
        self.evictions.labels("released").inc(counters.evicted_released - last.evicted_released)
        self.evictions.labels("idle").inc(counters.evicted_idle - last.evicted_idle)
        self.evictions.labels("expired").inc(counters.evicted_expired - last.evicted_expired)
        self._seen[partition] = Counters(
            **{f.name: getattr(counters, f.name) for f in fields(Counters)}
        )

    def lease_health(self, partition: int, health: LeaseHealth) -> None:
        """Turn one partition engine's cumulative lease-health counts into increments, under
        labels bounded again across the worker's partitions. A label set appears at 0."""
        seen = self._lease_seen.setdefault(partition, {})
        for labels, stats in health.stats.items():
            now = _LeaseSeen.of(stats)
            last = seen.get(labels)
            if last == now:
                continue
            then = _NOTHING_SEEN if last is None else last
            seen[labels] = now
            exported = self._lease_labels.bound(labels)
            self.heartbeat_age.add(
                exported,
                _minus(now.heartbeat_age, then.heartbeat_age),
                now.heartbeat_age_sum - then.heartbeat_age_sum,
            )
            self.lease_remaining.add(
                exported,
                _minus(now.remaining, then.remaining),
                now.remaining_sum - then.remaining_sum,
            )
            self.leases_expired.labels(*exported).inc(now.expired - then.expired)
            self.jobs_reclaimed.labels(*exported).inc(now.reclaimed - then.reclaimed)
            self.takeover_delay.add(
                exported,
                _minus(now.takeover_delay, then.takeover_delay),
                now.takeover_delay_sum - then.takeover_delay_sum,
            )
            self.takeovers_early.labels(*exported).inc(now.early - then.early)
            self.extension_failures.labels(*exported, "lost").inc(now.lost - then.lost)
            self.extension_failures.labels(*exported, "uncertain").inc(
                now.uncertain - then.uncertain
            )

    def finding_stats(self, partition: int, stats: FindingStats) -> None:
        """Turn one partition engine's cumulative finding observations into increments."""
        seen = self._finding_seen.setdefault(partition, {})
        observed: tuple[tuple[_EngineHistogram, dict[Severity, Observations]], ...] = (
            (self.zombie_seconds, stats.zombie_seconds),
            (self.zombie_seq, stats.zombie_seq),
            (self.resolution_seconds, stats.resolution),
        )
        for histogram, by_severity in observed:
            for severity, obs in by_severity.items():
                slot = (histogram.name, severity.value)
                now = (tuple(obs.counts), obs.total)
                last = seen.get(slot)
                if last == now:
                    continue
                seen[slot] = now
                then = last if last is not None else ((0,) * len(now[0]), 0.0)
                histogram.add((severity.value,), _minus(now[0], then[0]), now[1] - then[1])

    def findings_open_age(
        self, partition: int, now: float, oldest: Mapping[Severity, float] | None
    ) -> None:
        """`oldest`: when the oldest open finding of each severity went open (`Detector.
        oldest_open_findings`), on the clock of `now`; None: the partition is not ours."""
        for severity in Severity:
            if oldest is None:
                self.oldest_open.remove(str(partition), severity.value)
            else:
                at = oldest.get(severity)
                age = 0.0 if at is None else max(now - at, 0.0)
                self.oldest_open.labels(str(partition), severity.value).set(age)

    def partition_gone(self, partition: int) -> None:
        """The partition went to another worker: no workflows here, and no lag or open findings
        frozen at their last values (an alert would go on reading them)."""
        self.state(partition, 0)
        self.consumer_lag(partition, None)
        self.findings_open(partition, None)
        self.findings_open_age(partition, 0.0, None)
        self.engine_replaced(partition)

    def engine_replaced(self, partition: int) -> None:
        """A partition got a fresh engine (restore): its counts start again from zero."""
        self._seen.pop(partition, None)
        self._lease_seen.pop(partition, None)
        self._finding_seen.pop(partition, None)

    def committed(
        self, seconds: float, events: int, partitions: Iterable[int] | None = None
    ) -> None:
        """A transaction committed the work of `partitions` (None: every partition)."""
        for partition in list(self._pending) if partitions is None else partitions:
            exemplars = self._exemplars.pop(partition, {})
            for (counter, labels), amount in self._pending.pop(partition, {}).items():
                trace_id = exemplars.get((counter, labels))
                exemplar = None if trace_id is None else {"trace_id": trace_id}
                (counter.labels(*labels) if labels else counter).inc(amount, exemplar)
        self.transactions.labels("committed").inc()
        self.commit_seconds.observe(seconds)
        self.batch_events.observe(events)

    def aborted(self) -> None:
        """The open transaction aborted: its work will be done again, and counted then."""
        self._pending.clear()
        self._exemplars.clear()
        self.transactions.labels("aborted").inc()

    def revoked(self, partitions: Iterable[int]) -> None:
        """Partitions left with uncommitted work: their next owner does it again."""
        for partition in partitions:
            self._pending.pop(partition, None)
            self._exemplars.pop(partition, None)

    def restored(self, seconds: float, records: int = 0) -> None:
        """A restore took `seconds` and read `records` changelog records (the faust runtime's
        table does not count them)."""
        self.restore_seconds.observe(seconds)
        self.restore_records.inc(records)

    def standby_lag(self, partition: int, records: int | None) -> None:
        """None: the partition is not kept warm here (any more), or its end is not known yet."""
        _records_behind(self.standby_lag_records, partition, records)


def _records_behind(gauge: Gauge, partition: int, records: int | None) -> None:
    """A partition's lag, never negative (an end cached before the last fetch); None removes
    its series, so that no alert reads a value frozen for a partition no longer here."""
    if records is None:
        gauge.remove(str(partition))  # a no-op for a series that does not exist
    else:
        gauge.labels(str(partition)).set(max(0, records))
