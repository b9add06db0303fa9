"""The pager bridge's loop: findings topic → `PageState` → sinks → state topic → offsets.

One batch at a time, in this order, so that nothing is lost and nothing is announced twice:

1. consume finding revisions (read_committed: a finding from an aborted detector transaction
   never happened), keep the latest per finding; an invalid record is logged with its
   coordinates and skipped;
2. plan what each sink must be sent, and deliver it: while a delivery waits for a sink (retries
   with backoff), the findings partitions are paused and the consumer keeps polling, so the
   bridge stays in its group and reads nothing further;
3. write the changed state records to the state topic and wait for the broker's acknowledgement;
4. commit the batch's offsets.

A crash before 3 sends the batch again after the restart (at least once; the sinks' dedup keys
make it one incident); a crash between 3 and 4 reads the batch again and finds every revision
already known. After an assignment the state of the assigned partitions is read back from the
state topic, the backlog up to the partitions' end is read before anything is planned (so a
finding that opened and resolved while the bridge was away is not announced at all), and
Alertmanager is sent every open finding again, then on an interval.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any, Final, Protocol

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from detector.contracts.findings import SCHEMA as FINDING_SCHEMA
from detector.contracts.findings import Finding
from detector.contracts.page_state import PageStateRecord, SinkName
from detector.errors import ExitCode
from detector.kafka.config import KafkaClientError, describe
from detector.kafka.stateful.rebalance import subscribe
from detector.kafka.stateful.recovery import StateRestore, StateTopicError
from detector.kafka.stateful.topics import TopologyError, ensure_state_topic
from detector.paging.alertmanager import AlertmanagerSink
from detector.paging.delivery import Answer, Backoff, DeliveryOutcome, Request, origin, post, redact
from detector.paging.metrics import PageMetrics
from detector.paging.settings import PageSettings
from detector.paging.state import Delivery, PageState, SinkPolicy
from detector.paging.store import StateTopic
from detector.report import printable


def utc(seconds: float) -> datetime:
    """A Unix time as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)


log = logging.getLogger(__name__)

_BATCH: Final = 500
_POLL_S: Final = 0.2
_LAG_EVERY_S: Final = 5.0
_EXPIRE_EVERY_S: Final = 60.0
_RESEND_CHUNK: Final = 500
_RESTORE_TIMEOUT_S: Final = 120.0  # then exit 1: its supervisor restarts it
# As topics/topics.yaml has it: a daily roll, so that tombstones shrink the topic within a day
# or so (the cleaner compacts closed segments only), and a restore reads what is remembered.
_STATE_CONFIG: Final = {"cleanup.policy": "compact", "segment.ms": "86400000"}


class Sink(Protocol):
    @property
    def url(self) -> str: ...

    def request(self, delivery: Delivery, now: datetime) -> Request: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BridgeSettings:
    """What the bridge runs with: the declared settings, and what `splitbrain page` builds from
    them and from the Kafka connection."""

    page: PageSettings
    # librdkafka connection settings (`detector.kafka.config`), with any password: not in repr
    kafka: Mapping[str, Any] = field(repr=False)
    sinks: Mapping[SinkName, Sink]
    policies: Mapping[SinkName, SinkPolicy]

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.page.retry_initial_s, self.page.retry_max_s)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values never logged, even when a sink echoes one back."""
        return tuple(
            s.get_secret_value()
            for s in (self.page.pagerduty_routing_key, self.page.webhook_secret)
            if s is not None
        )


@dataclass(slots=True)
class _Attempt:
    delivery: Delivery
    request: Request
    attempts: int = 0
    due: float = 0.0  # monotonic


class Bridge:
    def __init__(
        self,
        settings: BridgeSettings,
        metrics: PageMetrics,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.s = settings
        self.page = settings.page
        self.metrics = metrics
        self.clock = clock
        self.rng = rng or random.Random()
        self.state = PageState(settings.policies)
        self.store = StateTopic(settings.kafka, settings.page.state_topic)
        self.restore = StateRestore(
            settings.kafka,
            settings.page.state_topic,
            group_id=f"{settings.page.group_id}-restore",
            timeout_s=_RESTORE_TIMEOUT_S,
        )
        self.consumer = Consumer(
            {
                **settings.kafka,
                "group.id": settings.page.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,  # the end of the backlog after an assignment
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 2000,
                # Eager: a rebalance revokes every partition, so an unfinished batch is dropped
                # whole and read again from the committed offsets by whoever gets it.
                "partition.assignment.strategy": "range",
            }
        )
        self.pending: list[_Attempt] = []
        # Partition -> next offset of what was read since the last commit (handled once the batch
        # is delivered; the commit itself takes the consumer's position).
        self.offsets: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.assigned: set[int] = set()
        self.catching_up: set[int] = set()
        self.paused = False
        self.broken = False  # the state topic failed: write nothing more, commit nothing
        self.stopping = False
        self.stop_by = float("inf")
        self.next_resend = 0.0
        self.next_lag = 0.0
        # A retention shorter than the usual period is looked at as often as it lasts (a second
        # at least), so that what it lets go is tombstoned about when it expires.
        self.expire_every = max(1.0, min(_EXPIRE_EVERY_S, settings.page.resolved_retention_s))
        self.next_expire = time.monotonic() + self.expire_every

    # ---- lifecycle ----------------------------------------------------------------------------

    def run(self) -> int:
        """Until SIGTERM/SIGINT: then finish the deliveries in flight, commit, exit 0."""
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        try:
            # log_level 5 (notice): librdkafka's note, at info level, that the client dropped an
            # admin event nobody waits for any more is noise in the bridge's log.
            admin = AdminClient({**self.s.kafka, "log_level": 5})
            ensure_state_topic(
                admin, self.page.findings_topic, "findings", self.page.state_topic, _STATE_CONFIG
            )
        except TopologyError as exc:
            log.error("cannot start the bridge: %s", exc)
            return ExitCode.UNUSABLE
        subscribe(self.consumer, self.page.findings_topic, self)
        sinks = ", ".join(f"{name} {origin(sink.url)}" for name, sink in self.s.sinks.items())
        log.info(
            "bridge started: group %s, %s -> %s; state in %s",
            self.page.group_id,
            self.page.findings_topic,
            sinks,
            self.page.state_topic,
        )
        try:
            while not self.stopping:
                self._step()
            self._drain()
        except StateTopicError as exc:
            self.broken = True
            log.error("stopping: %s; nothing more is committed", exc)
            return ExitCode.FAILED
        finally:
            try:
                self.consumer.close()  # its revocation saves and commits what is done
            except StateTopicError as exc:
                log.error("closing: %s; nothing more is committed", exc)
            self.store.close()
        log.info("bridge stopped cleanly")
        return ExitCode.OK

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_by = time.monotonic() + self.page.shutdown_timeout_s

    def _drain(self) -> None:
        """Stopping: the deliveries in flight get until `stop_by` to be taken."""
        while self.pending and time.monotonic() < self.stop_by:
            self._attempt()
            if self.pending:
                self._poll_paused(min(self._next_due(), self.stop_by) - time.monotonic())
        if self.pending:
            waiting = Counter(a.delivery.sink.value for a in self.pending)
            log.warning(
                "stopping with %d delivery(ies) not taken (%s): they are sent at the next start",
                len(self.pending),
                ", ".join(f"{sink} {n}" for sink, n in sorted(waiting.items())),
            )
            self._persist()  # what the sinks did take; the offsets stay where they are
        elif self.catching_up:
            self._persist()
        else:
            self._complete()

    # ---- the loop -----------------------------------------------------------------------------

    def _step(self) -> None:
        self._housekeeping()
        if self.pending:
            self._attempt()
            if self.pending:
                self._poll_paused(self._next_due() - time.monotonic())
                return
            self._complete()
            return
        for msg in self.consumer.consume(_BATCH, timeout=_POLL_S):
            self._record(msg)
        if not self.catching_up:
            self._plan()

    def _record(self, msg: Message) -> None:
        err = msg.error()
        partition = msg.partition()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self.catching_up.discard(partition if partition is not None else -1)
            elif err.fatal():
                raise KafkaClientError(f"Kafka: {err.str()}")
            else:
                log.warning("reading %s: %s", self.page.findings_topic, err.str())
            return
        topic, offset = msg.topic(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        if partition not in self.assigned:
            return  # revoked while the batch was fetched
        self.offsets[partition] = offset + 1
        try:
            finding = Finding.model_validate_json(msg.value() or b"")
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "value"
            log.warning(
                "skipped %s[%d]@%d: not a valid %s: %s",
                topic,
                partition,
                offset,
                FINDING_SCHEMA,
                printable(f"{where}: {first['msg']}"),
            )
            self.metrics.invalid.inc()
            return
        kind, millis = msg.timestamp()
        at = millis / 1000 if kind != TIMESTAMP_NOT_AVAILABLE and millis > 0 else self.clock()
        self.state.observe(finding, partition, utc(at))

    def _plan(self) -> None:
        deliveries = self.state.plan()
        if not deliveries:
            if self.offsets or self.state.unsaved or self._ahead():
                self._complete()
            return
        now = utc(self.clock())
        self.pending = [_Attempt(d, self.s.sinks[d.sink].request(d, now)) for d in deliveries]
        self._pause()
        self._report_pending()

    def _attempt(self) -> None:
        """Send each delivery that is due once; keep those still to take."""
        still: list[_Attempt] = []
        for a in self.pending:
            now = time.monotonic()
            if a.due > now or (self.stopping and now >= self.stop_by):
                still.append(a)
                continue
            answer = post(a.request, self.page.http_timeout_s)
            if not self._answered(a, answer):
                still.append(a)
        self.pending = still
        self._report_pending()

    def _answered(self, a: _Attempt, answer: Answer) -> bool:
        """Record the sink's answer; True when the delivery is done (taken or dead)."""
        d = a.delivery
        f = d.finding
        when = self.clock()
        what = f"{d.action.value} of {printable(d.finding_id)} rev {f.revision}"
        detail = printable(redact(answer.detail, self.s.secrets))
        if answer.outcome is DeliveryOutcome.ACCEPTED:
            self.state.done(d, "accepted", utc(when))
            self.metrics.answered(
                d.sink, DeliveryOutcome.ACCEPTED, when - d.revision_at.timestamp()
            )
            log.info("%s took %s (%s)", d.sink.value, what, f.severity.value)
            return True
        if answer.outcome is DeliveryOutcome.DEAD_LETTER:
            self.state.done(d, "dead_letter", utc(when))
            self.metrics.answered(d.sink, DeliveryOutcome.DEAD_LETTER)
            log.error(
                "dead letter: sink=%s finding=%s revision=%d action=%s status=%s: %s",
                d.sink.value,
                printable(d.finding_id),
                f.revision,
                d.action.value,
                answer.status if answer.status is not None else "none",
                detail,
            )
            return True
        a.attempts += 1
        delay = self.s.backoff.delay(a.attempts, self.rng, answer.retry_after)
        a.due = time.monotonic() + delay
        self.metrics.answered(d.sink, DeliveryOutcome.RETRIED)
        log.warning(
            "%s did not take %s (status %s: %s): retry %d in %.1f s",
            d.sink.value,
            what,
            answer.status if answer.status is not None else "none",
            detail,
            a.attempts,
            delay,
        )
        return False

    def _complete(self) -> None:
        """Every delivery of the batch is done: save the state, then commit the offsets."""
        self._persist()
        offsets = self._ahead()
        if offsets:
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
                self.committed.update({tp.partition: tp.offset for tp in offsets})
                self.next_lag = min(self.next_lag, time.monotonic() + 0.5)
            except KafkaException as exc:
                # A rebalance got there first: the records are read again by their next owner,
                # which finds them in the state already written.
                log.warning("offsets not committed: %s", describe(exc))
        self.offsets.clear()
        self._resume()
        self.metrics.findings_open(self.state.open_counts())

    def _ahead(self) -> list[TopicPartition]:
        """The consumer's position in each assigned partition that is past the committed offset.
        Every record before it has been handled when this is asked; the position, not the last
        record's offset + 1, also steps over the detector's transaction markers, which would
        otherwise count as lag forever."""
        if not self.assigned:
            return []
        asked = [TopicPartition(self.page.findings_topic, p) for p in sorted(self.assigned)]
        return [
            TopicPartition(self.page.findings_topic, tp.partition, tp.offset)
            for tp in self.consumer.position(asked)
            if tp.offset >= 0 and tp.offset > self.committed.get(tp.partition, -1)
        ]

    def _persist(self) -> None:
        items = self.state.take_unsaved()
        if items:
            self.store.write(
                [(fid, p, None if rec is None else rec.to_json()) for fid, p, rec in items]
            )

    def _next_due(self) -> float:
        return min((a.due for a in self.pending), default=time.monotonic())

    def _poll_paused(self, seconds: float) -> None:
        """Keep the group membership (and serve rebalances) while the partitions are paused."""
        msg = self.consumer.poll(max(0.0, min(_POLL_S, seconds)))
        if msg is None:
            return
        if msg.error() is None and msg.partition() in self.assigned:
            # Fetched before the pause: give it back, it is read again after the resume.
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            self.consumer.seek(TopicPartition(topic, partition, offset))

    def _pause(self) -> None:
        parts = self.consumer.assignment()
        if parts:
            self.consumer.pause(parts)
        self.paused = True

    def _resume(self) -> None:
        if self.paused:
            parts = self.consumer.assignment()
            if parts:
                self.consumer.resume(parts)
            self.paused = False

    # ---- timers -------------------------------------------------------------------------------

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self.next_lag:
            self.next_lag = now + _LAG_EVERY_S
            self._report_lag()
            self.metrics.findings_open(self.state.open_counts())
        if (
            SinkName.ALERTMANAGER in self.s.sinks
            and self.assigned
            and not self.catching_up
            and now >= self.next_resend
        ):
            self.next_resend = now + self.page.alertmanager_resend_interval_s
            self._resend()
        if (
            not self.pending
            and not self.offsets
            and not self.catching_up
            and now >= (self.next_expire)
        ):
            self.next_expire = now + self.expire_every
            retention = timedelta(seconds=self.page.resolved_retention_s)
            if self.state.expire(utc(self.clock()), retention):
                self._persist()

    def _resend(self) -> None:
        """Alertmanager forgets an alert that is not sent again within its resolve_timeout."""
        sink = self.s.sinks[SinkName.ALERTMANAGER]
        assert isinstance(sink, AlertmanagerSink)
        entries = self.state.resend(SinkName.ALERTMANAGER)
        for i in range(0, len(entries), _RESEND_CHUNK):
            chunk = entries[i : i + _RESEND_CHUNK]
            answer = post(sink.resend(chunk), self.page.http_timeout_s)
            self.metrics.answered(SinkName.ALERTMANAGER, answer.outcome)
            if answer.outcome is not DeliveryOutcome.ACCEPTED:
                log.warning(
                    "alertmanager did not take the re-send of %d open finding(s) (status %s: %s);"
                    " next try in %.0f s",
                    len(chunk),
                    answer.status if answer.status is not None else "none",
                    printable(redact(answer.detail, self.s.secrets)),
                    self.page.alertmanager_resend_interval_s,
                )
                return

    def _report_lag(self) -> None:
        for p in sorted(self.assigned):
            tp = TopicPartition(self.page.findings_topic, p)
            try:
                low, high = self.consumer.get_watermark_offsets(tp, timeout=1.0, cached=False)
            except KafkaException:
                continue
            committed = self.committed.get(p, -1)
            self.metrics.consumer_lag(p, max(0, high - (committed if committed >= 0 else low)))

    def _report_pending(self) -> None:
        counts = Counter(a.delivery.sink for a in self.pending)
        self.metrics.waiting(counts, self.s.sinks)

    # ---- rebalances ---------------------------------------------------------------------------

    def partitions_assigned(self, partitions: list[int]) -> None:
        started = time.monotonic()
        ps = sorted(partitions)
        asked = [TopicPartition(self.page.findings_topic, p) for p in ps]
        for tp in self.consumer.committed(asked, timeout=30):
            self.committed[tp.partition] = tp.offset
        before = len(self.state.entries)
        for p, offset, key, value in self.restore.read(ps):
            fid = key.decode("utf-8", "replace")
            if value is None:
                self.state.forget(fid)
                continue
            try:
                record = PageStateRecord.model_validate_json(value)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                log.warning(
                    "skipped %s[%d]@%d: not a valid state record: %s",
                    self.page.state_topic,
                    p,
                    offset,
                    printable(f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"),
                )
                continue
            self.state.restore(record, p)
        self.assigned |= set(ps)
        self.catching_up |= set(ps)
        self.paused = False
        self.next_resend = 0.0  # once caught up: whatever Alertmanager lost meanwhile
        log.info(
            "assigned %s[%s]: %d finding(s) restored from %s in %.1f s",
            self.page.findings_topic,
            ",".join(map(str, ps)),
            len(self.state.entries) - before,
            self.page.state_topic,
            time.monotonic() - started,
        )

    def partitions_revoked(self, partitions: list[int]) -> None:
        if self.broken:
            pass
        elif self.pending or self.catching_up:
            # An unfinished batch: keep what the sinks took; its records are read again.
            self._persist()
        else:
            self._complete()
        self._forget(partitions)

    def partitions_lost(self, partitions: list[int]) -> None:
        # Another bridge may own them already: write nothing for them.
        log.warning("partitions %s lost: their unsaved state is dropped", sorted(partitions))
        self._forget(partitions)

    def _forget(self, partitions: list[int]) -> None:
        ps = set(partitions)
        self.pending.clear()
        self.offsets.clear()
        self.paused = False
        self.state.drop_partitions(ps)
        self.assigned -= ps
        self.catching_up -= ps
        for p in ps:
            self.committed.pop(p, None)
            self.metrics.consumer_lag(p, None)
        self._report_pending()
        self.metrics.findings_open(self.state.open_counts())
