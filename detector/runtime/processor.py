"""One input partition's processing step, the same in every runtime.

A runtime only moves records: it polls, hands each record to `PartitionProcessor.process`, lets
time pass with `tick`, and hands the `Writes` they return (finding revisions, dead letters, the
workflows whose state changed) to its `detector.runtime.checkpoint.Checkpoint`, which turns them
into the records of its transaction. Admission,
detection, the quiet-period clock, the finding log line, every per-record metric and what an
exception of the engine costs (one event, never the partition) are decided here, once.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from detector.contracts.dead_letters import DeadLetter
from detector.contracts.events import OwnershipEvent
from detector.core import Detector, FindingUpdate, encode_state
from detector.runtime.engine_errors import EngineError
from detector.runtime.intake import admit
from detector.telemetry.metrics import WorkerMetrics
from detector.telemetry.trace_context import Headers

if TYPE_CHECKING:
    from detector.telemetry.tracing import PartitionTracing

log = logging.getLogger(__name__)

# How often a partition lets time pass (quiet periods, eviction, state metrics), on the worker's
# own clock. Silence is measured on processing time: no producer's CreateTime and no emitter's
# observed_at can resolve a finding in a worker.
TICK_EVERY_S: Final = 5.0


@dataclass(slots=True)
class Writes:
    """What one step asks its runtime to write, in the transaction of its input partition."""

    findings: list[FindingUpdate] = field(default_factory=list)
    dead_letter: DeadLetter | None = None
    changed: set[str] = field(default_factory=set)  # workflows whose state to persist


@dataclass(slots=True)
class PartitionProcessor:
    """The engine of one input partition, and what every runtime does around it."""

    partition: int
    detector: Detector
    metrics: WorkerMetrics
    last_tick: float | None = None
    tracing: PartitionTracing | None = None  # None: tracing is off

    def process(
        self,
        key: bytes | None,
        value: bytes | None,
        topic: str,
        offset: int,
        now: float,
        headers: Headers = None,
    ) -> Writes:
        """One input record at the worker's time `now`; `headers` may carry its `traceparent`."""
        partition = self.partition
        admitted = admit(key, value, topic, partition, offset, headers)
        if isinstance(admitted, DeadLetter):
            self.metrics.dead_letter(admitted.reason_code, partition)
            log.warning(
                "dead letter %s[%d]@%d: %s (field %s)",
                topic,
                partition,
                offset,
                admitted.reason_code,
                admitted.field,
            )
            return Writes(dead_letter=admitted)
        self.metrics.event(admitted.kind.value, partition)
        if admitted.dropped_fields:
            self.metrics.fields_dropped(admitted, partition)
        if self.tracing is not None:
            self.tracing.remember(admitted)
        try:
            updates = self.detector.observe(admitted, at=now)
        except Exception as exc:
            error = EngineError.of(exc)
            self._failed(admitted, error, topic, offset)
            dead = error.dead_letter(key, value, topic, partition, offset)
            return Writes(dead_letter=dead, changed={admitted.workflow_key})
        self._published(updates)
        return Writes(updates, None, {admitted.workflow_key})

    def tick(self, now: float) -> Writes | None:
        """Let time pass, at most every `TICK_EVERY_S`: None when it is not due."""
        if self.last_tick is not None and now - self.last_tick < TICK_EVERY_S:
            return None
        self.last_tick = now
        advanced = self.detector.advance(now, self._tick_failed)
        self._published(advanced.updates)
        partition = self.partition
        self.metrics.state(partition, len(self.detector.states))
        self.metrics.engine(partition, self.detector.counters)
        self.metrics.lease_health(partition, self.detector.lease_health)
        self.metrics.findings_open(partition, self.detector.open_findings())
        self.metrics.findings_open_age(partition, now, self.detector.oldest_open_findings())
        self.metrics.finding_stats(partition, self.detector.finding_stats)
        # A resolved finding's new revision lives in its state: persist it with the revision,
        # or a restore would publish the same (finding_id, revision) again.
        return Writes(advanced.updates, None, advanced.changed)

    def encoded_state(self, key: str) -> bytes | None:
        """A workflow's state as the changelog keeps it; None: the engine evicted it."""
        state = self.detector.states.get(key)
        return None if state is None else encode_state(state)

    def _failed(self, event: OwnershipEvent, error: EngineError, topic: str, offset: int) -> None:
        """The engine raised on `event`: one event must never stop a partition, so it goes to
        the DLQ (the caller's writes) and the partition goes on. Its offset commits with the
        rest of the transaction and its workflow's state, marked (`Detector.failed`), with it:
        a restart does not meet the event again."""
        self.detector.failed(event.workflow_key)
        self.metrics.engine_error(self.partition)
        log.error(
            "engine error on %s[%d]@%d (workflow#%s): %s, traceback %s; the event is "
            "dead-lettered and its workflow's findings say evidence_truncated\n%s",
            topic,
            self.partition,
            offset,
            _short_hash(event.workflow_key),
            error.error_class,
            error.traceback_hash,
            error.stack,
        )

    def _tick_failed(self, workflow_key: str, exc: Exception) -> None:
        """The engine raised while time passed for one workflow: that workflow alone is marked
        (its findings say evidence_truncated), counted and logged as an event's error is; the
        others' time goes on, and the tick commits."""
        error = EngineError.of(exc)
        self.metrics.engine_error(self.partition)
        log.error(
            "engine error letting time pass on partition %d (workflow#%s): %s, traceback %s; "
            "its findings say evidence_truncated\n%s",
            self.partition,
            _short_hash(workflow_key),
            error.error_class,
            error.traceback_hash,
            error.stack,
        )

    def _published(self, updates: list[FindingUpdate]) -> None:
        for update in updates:
            f = update.finding
            trace_id = None if self.tracing is None else self.tracing.finding(update)
            self.metrics.finding_revision(update, self.partition, trace_id)
            log.info(
                "finding %s rev %d %s %s workflow#%s conditions=%s",
                f.finding_id,
                f.revision,
                f.severity.value,
                f.status.value,
                _short_hash(f.workflow_key),
                ",".join(c.kind.value for c in f.conditions),
            )


def _short_hash(text: str) -> str:
    """Workflow keys can name tenants: logs carry a hash."""
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
