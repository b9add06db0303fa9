"""Kafka consumer groups: a partition's owner, and the zombie that finishes its batch after a
rebalance gave the partition to another member (confluent-kafka; the classic protocol, and
KIP-848's, where librdkafka keeps the member epoch where the generation was and the same reading
gives it).

`ConsumerWatch` wraps a `confluent_kafka.Consumer` the user already made; nothing else in the
consumer loop changes but three calls:

    watch = ConsumerWatch(consumer, group="payments")
    watch.subscribe(["orders"])                  # instead of consumer.subscribe(...)
    while True:
        msg = consumer.poll(1.0)
        ...
        with watch.processing(msg) as key:       # key: "orders/3/1042", the default effect key
            db.charge(...)
            effect_committed(key, destination="db")
        watch.commit(msg)                        # instead of consumer.commit(msg)

Per partition (key: group/topic/partition) the epoch is the group generation at which this
member *acquired* it: a rebalance that leaves the partition with the same member keeps the epoch
(a generation is per group, and grows with every rebalance). The broker assigns the generation,
it only grows, and the broker refuses a stale member's offset commits: `system`. It is read from
`consumer_group_metadata()` (librdkafka's serialised form, `CGMDv2:` and the generation as an
int32 in the machine's own byte order, copied as it lies in memory; confluent-kafka does not
bind the public getter).

Events: `lease_acquired` from `on_assign`; `lease_released` when a revoked partition is not
assigned back (the eager protocol revokes everything at each rebalance, so a revocation is
settled at the next assignment; the incremental ones call the assignment callback after a
revocation too, with an empty list when nothing is added); `lease_lost` from `on_lost` and from
a commit the group refuses (`_ASSIGNMENT_LOST`, `UNKNOWN_MEMBER_ID`, `ILLEGAL_GENERATION`);
`ownership_uncertain` when `memberid()` is gone while the member still processes (librdkafka
clears it when its session expires or it leaves the group on `max.poll.interval.ms`, before any
callback runs). No `seq`: offsets order records, not ownership; findings are ordered by arrival.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from contextvars import Token
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from detector.contracts.events import Kind

from ._context import Authority, Ownership, enter, leave, words
from ._sink import AdapterSink

log = logging.getLogger(__name__)

ADAPTER: Final = "kafka-consumer"
EPOCH_FROM: Final = "kafka.group_generation"
_MAGIC: Final = b"CGMDv2:"
MEMBER_CHECK_S: Final = 0.1  # how often processing asks librdkafka for the member id
# How long a revocation, or leaving the group, waits for this member's events to reach Kafka. The
# group hands its partitions on only once it has rejoined or left, so its last effects then
# arrive before the next owner's acquisition (findings are ordered by arrival).
HANDOVER_FLUSH_S: Final = 2.0
# Commit errors that say the member no longer owns what it committed for.
LOST_CODES: Final = frozenset(
    {
        KafkaError._ASSIGNMENT_LOST,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
    }
)

Callback = Callable[[Consumer, list[TopicPartition]], None]
_Key = tuple[str, int]


def generation(consumer: Consumer) -> int | None:
    """The group generation the member is in, None when it is in none (or cannot say)."""
    try:
        meta = consumer.consumer_group_metadata()
    except Exception:
        return None
    if not isinstance(meta, bytes) or not meta.startswith(_MAGIC) or len(meta) < len(_MAGIC) + 4:
        return None
    (value,) = struct.unpack_from("=i", meta, len(_MAGIC))
    return int(value) if value >= 0 else None


def effect_key(msg: Message) -> str:
    """The default effect key of a record: topic/partition/offset."""
    return f"{msg.topic()}/{msg.partition()}/{msg.offset()}"


class _Processing:
    """One record's processing: its partition's owner for the block, and its effect key."""

    __slots__ = ("_msg", "_ownership", "_token")

    def __init__(self, ownership: Ownership | None, msg: Message) -> None:
        self._ownership = ownership
        self._msg = msg
        self._token: Token[Ownership | None] | None = None

    def __enter__(self) -> str:
        if self._ownership is not None:
            self._token = enter(self._ownership)
        return effect_key(self._msg)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            leave(self._token)
            self._token = None


class ConsumerWatch:
    """The partitions one consumer owns, as ownership events."""

    def __init__(
        self,
        consumer: Consumer,
        group: str,
        *,
        sink: AdapterSink | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.consumer = consumer
        self.group = group
        self.sink = sink if sink is not None else AdapterSink(ADAPTER)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.owned: dict[_Key, Ownership] = {}
        self._revoking: dict[_Key, Ownership] = {}
        self._uncertain: set[_Key] = set()
        self._next_check = 0.0  # time.monotonic() of the next memberid() check
        self._member_gone = False

    # ---- the group's callbacks --------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        *,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        on_lost: Callback | None = None,
    ) -> None:
        """`consumer.subscribe(topics, ...)` with the watch's callbacks before the user's."""

        def assign(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._guarded(self._assigned, partitions)
            if on_assign is not None:
                on_assign(c, partitions)

        def revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._guarded(self._revoked, partitions)
            if on_revoke is not None:
                on_revoke(c, partitions)

        def lost(c: Consumer, partitions: list[TopicPartition]) -> None:
            self._guarded(self._lost_all, partitions, "on_lost")
            if on_lost is not None:
                on_lost(c, partitions)

        self.consumer.subscribe(topics, on_assign=assign, on_revoke=revoke, on_lost=lost)

    def _guarded(self, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except Exception:  # the consumer's rebalance must never see our failure
            log.exception("kafka-consumer adapter: %s failed", call.__name__)

    def _assigned(self, partitions: list[TopicPartition]) -> None:
        gen = generation(self.consumer)
        member = self.consumer.memberid()
        if gen is None and partitions:
            log.warning(
                "kafka-consumer adapter: group %r gave no generation at an assignment of %d "
                "partition(s): they are not reported",
                self.group,
                len(partitions),
            )
        for tp in partitions:
            key = (tp.topic, tp.partition)
            kept = self._revoking.pop(key, None)
            if kept is not None:  # revoked and assigned back: the same owner, the same epoch
                self.owned[key] = kept
                continue
            if key in self.owned or gen is None:
                continue
            ownership = Ownership(
                self.sink,
                f"{self.group}/{tp.topic}/{tp.partition}",
                gen,
                self.worker_id,
                Authority.SYSTEM,
                EPOCH_FROM,
                words=words(
                    group=self.group,
                    topic=tp.topic,
                    partition=tp.partition,
                    generation=gen,
                    member_id=member,
                ),
            )
            ownership.acquired()
            self.owned[key] = ownership
            self._uncertain.discard(key)
        self._settle_revoked()

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            key = (tp.topic, tp.partition)
            ownership = self.owned.pop(key, None)
            if ownership is not None:
                self._revoking[key] = ownership
        self.sink.flush(HANDOVER_FLUSH_S)

    def _settle_revoked(self) -> None:
        """Revoked and not assigned back: released."""
        for ownership in self._revoking.values():
            ownership.emit(Kind.LEASE_RELEASED, detail={"reason": "revoked"})
        self._revoking.clear()

    def _lost_all(self, partitions: list[TopicPartition] | None, reason: str) -> None:
        keys = (
            list(self.owned) + list(self._revoking)
            if partitions is None
            else [(tp.topic, tp.partition) for tp in partitions]
        )
        for key in keys:
            ownership = self.owned.pop(key, None) or self._revoking.pop(key, None)
            if ownership is not None:
                ownership.note(lost_at=reason)
                ownership.emit(Kind.LEASE_LOST, detail={"reason": reason})

    # ---- the consumer loop ------------------------------------------------------------------

    def processing(self, msg: Message) -> _Processing:
        """Process `msg` as its partition's owner (`with watch.processing(msg) as key:`):
        effect calls inside carry the partition's key and the epoch this member acquired it at;
        the block gets the record's default effect key. A member whose `memberid()` is gone
        (checked at most every `MEMBER_CHECK_S`) is no longer sure it owns the partition
        (`ownership_uncertain`, once per acquisition)."""
        topic, partition = msg.topic(), msg.partition()
        key = (topic or "", -1 if partition is None else partition)
        ownership = self.owned.get(key) or self._revoking.get(key)
        if ownership is not None and key not in self._uncertain:
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + MEMBER_CHECK_S
                self._member_gone = self.consumer.memberid() is None
            if self._member_gone:
                self._uncertain.add(key)
                ownership.emit(Kind.OWNERSHIP_UNCERTAIN, detail={"reason": "member_id_gone"})
        return _Processing(ownership, msg)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        """`consumer.commit(...)`; a refusal that says the member lost its partitions reports
        `lease_lost` for every partition it held, then raises as the consumer did."""
        try:
            return self.consumer.commit(*args, **kwargs)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code in LOST_CODES:
                self._guarded(self._lost_all, None, f"commit:{error.name()}")  # type: ignore[union-attr]
            raise

    def close(self) -> None:
        """`consumer.close()`: leaves the group, and what it held is released. Its events are
        flushed first (`HANDOVER_FLUSH_S`), so that they arrive before the next owner's."""
        self.sink.flush(HANDOVER_FLUSH_S)
        self.consumer.close()
        self._guarded(self._release_all)

    def _release_all(self) -> None:
        self._revoking.update(self.owned)
        self.owned.clear()
        self._settle_revoked()
