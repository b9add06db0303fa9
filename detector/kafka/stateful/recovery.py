"""The restore of a state topic's assigned partitions, up to their high watermark.

Not merely to where a read_committed reader first reports the end: that is the last stable
offset, which stops short of a transaction whose commit the coordinator has acknowledged but not
yet marked on the partition (its markers are written after the producer's commit returns).
States read to there, with the committed offsets read after them, would resume past records
whose effect on the state was never loaded. A transaction still open (a paused zombie's) is
waited out: the coordinator aborts it at its timeout.

A standby (`detector.runtime.standby`) reads the same topic with the same consumer settings and
the same handling of each fetched message (`state_consumer`, `state_records`), without an end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from detector.errors import SplitbrainError
from detector.kafka.offsets import end_offsets

log = logging.getLogger(__name__)

_END_OFFSETS_TIMEOUT_S: Final = 5.0  # short: a stop during a restore is seen between asks
_RETRY_S: Final = 0.5
# A restore learns that it reached a partition's end from an empty fetch, which the broker holds
# up to fetch.wait.max.ms (librdkafka: 500) and a batch `consume` waits out its whole timeout:
# short, a standby's takeover (a few records) costs a fraction of a second, not one. An idle
# standby's consumer then asks its leaders ten times a second.
_FETCH_WAIT_MS: Final = 100
_CONSUME_S: Final = 0.1

# (partition, offset, key, value): a value of None is a tombstone.
StateRecord = tuple[int, int, bytes, bytes | None]


class StateTopicError(SplitbrainError, RuntimeError):
    """The state topic was not read, or a state record not written, in time: the offsets it
    accounts for are not committed."""


def _never() -> bool:
    return False


class StateRestore:
    """Reads the state of the partitions a consumer is assigned back from its state topic.

    `on_error` hears of every error the restore rides out (a broker that does not answer yet);
    with `timeout_s` a restore not done by then raises `StateTopicError`, without it the restore
    waits until `stopping`.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        group_id: str,
        on_error: Callable[[object], None] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.config = dict(config)
        self.topic = topic
        self.group_id = group_id
        self._error_cb = on_error
        self.timeout_s = timeout_s
        self._admin: AdminClient | None = None

    def read(
        self,
        partitions: Iterable[int],
        stopping: Callable[[], bool] = _never,
        starts: Mapping[int, int] | None = None,
        reached: dict[int, int] | None = None,
    ) -> Iterator[StateRecord]:
        """Every keyed record of `partitions` from `starts` (default: the beginning) to the high
        watermark as it was when the restore began; incomplete when `stopping` turned true.
        `reached`, if given, gets each partition's end once it is read there (its last stable
        offset: every committed record before it was yielded)."""
        deadline = time.monotonic() + (self.timeout_s or float("inf"))
        ends = self._high_watermarks(list(partitions), stopping, deadline)
        if ends is None:
            return
        reader = state_consumer(self.config, self.group_id, self._error_cb)
        first = starts or {}
        try:
            reader.assign(
                [TopicPartition(self.topic, p, first.get(p, OFFSET_BEGINNING)) for p in ends]
            )
            pending = set(ends)

            def eof(partition: int, offset: int) -> None:
                # Reported again, further on, once an undecided transaction is decided.
                if offset >= ends[partition]:
                    pending.discard(partition)
                    if reached is not None:
                        reached[partition] = offset
                else:
                    log.info(
                        "%s partition %d: a transaction at %d is undecided, waiting for it "
                        "(end %d)",
                        self.topic,
                        partition,
                        offset,
                        ends[partition],
                    )

            while pending and not stopping():  # a broker that is down must not pin a stop
                self._check(deadline, pending)
                messages = reader.consume(num_messages=1000, timeout=_CONSUME_S)
                yield from state_records(self.topic, messages, eof, self._report)
        finally:
            reader.close()

    def _high_watermarks(
        self, partitions: list[int], stopping: Callable[[], bool], deadline: float
    ) -> dict[int, int] | None:
        """Asked again while the broker does not answer (a restore cannot start without them);
        None when stopping."""
        while not stopping():
            if self._admin is None:
                self._admin = AdminClient(self.config)
            try:
                return end_offsets(
                    self._admin,
                    self.topic,
                    partitions,
                    IsolationLevel.READ_UNCOMMITTED,
                    timeout=_END_OFFSETS_TIMEOUT_S,
                )
            except (KafkaException, TimeoutError) as exc:
                # A broker restarted under the admin client can answer FENCED_LEADER_EPOCH to
                # every ask at once (its metadata is stale; seen for minutes in the torture
                # run), and a topic created a moment ago may not be known to every broker yet:
                # ask again after a pause, with a client that fetches metadata afresh.
                self._report(exc)
                self._check(deadline, set(partitions))
                log.warning("%s end offsets not known yet (%s); asking again", self.topic, exc)
                time.sleep(_RETRY_S)
                self._admin = None
        return None

    def _report(self, error: object) -> None:
        if self._error_cb is not None:
            self._error_cb(error)

    def _check(self, deadline: float, pending: set[int]) -> None:
        if time.monotonic() > deadline:
            raise StateTopicError(
                f"{self.topic}: partitions {sorted(pending)} not read to their end in "
                f"{self.timeout_s:.0f} s"
            )


def state_consumer(
    config: Mapping[str, Any], group_id: str, on_error: Callable[[object], None] | None
) -> Consumer:
    """A consumer of a state topic's partitions by `assign`: read_committed, so that no record
    of an aborted transaction (a fenced or dead owner's) is ever applied, and told of each
    partition's end. It commits nothing: `group_id` only names it to the broker."""
    return Consumer(
        {
            **config,
            **({} if on_error is None else {"error_cb": on_error}),
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": _FETCH_WAIT_MS,
        }
    )


def state_records(
    topic: str,
    messages: Sequence[Message],
    eof: Callable[[int, int], None],
    report: Callable[[object], None],
) -> Iterator[StateRecord]:
    """The keyed records among `messages` fetched from `topic`; `eof(partition, offset)` for
    each end of a partition reached (read_committed: its last stable offset). A fatal error
    raises; any other is reported and logged, and the reader goes on."""
    for msg in messages:
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        err = msg.error()
        if err is None:
            key = msg.key()
            if key is not None:
                yield partition, offset, key, msg.value()
        elif err.code() == KafkaError._PARTITION_EOF:
            eof(partition, offset)
        elif err.fatal():
            raise KafkaException(err)
        else:
            report(err)
            log.warning("reading %s: %s", topic, err.str())
