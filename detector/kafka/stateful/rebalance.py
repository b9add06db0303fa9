"""A stateful consumer's side of a group rebalance, lost partitions included.

librdkafka hands a partition back in one of two ways. Revoked: the consumer still owns it until
the callback returns, so it may commit what it finished. Lost (its session expired, or it was
fenced out of the group): another member may own it already and be restoring its state, so
nothing more is written or committed for it; it is dropped. Without an `on_lost` callback
confluent-kafka passes lost partitions to `on_revoke`, which cannot tell the two apart.
"""

from __future__ import annotations

from typing import Protocol

from confluent_kafka import Consumer, TopicPartition


class PartitionOwner(Protocol):
    """What a stateful consumer does when partitions come and go; each gets partition numbers
    of the one topic it subscribes to."""

    def partitions_assigned(self, partitions: list[int]) -> None:
        """Restore their state before anything of theirs is processed."""

    def partitions_revoked(self, partitions: list[int]) -> None:
        """Still ours until this returns: commit what may be committed, then drop them."""

    def partitions_lost(self, partitions: list[int]) -> None:
        """Already someone else's: drop them, writing and committing nothing for them."""


def subscribe(consumer: Consumer, topic: str, owner: PartitionOwner) -> None:
    """Subscribe `consumer` to `topic`, with `owner` told of every assignment change."""

    def numbers(partitions: list[TopicPartition]) -> list[int]:
        return [tp.partition for tp in partitions]

    consumer.subscribe(
        [topic],
        on_assign=lambda _, partitions: owner.partitions_assigned(numbers(partitions)),
        on_revoke=lambda _, partitions: owner.partitions_revoked(numbers(partitions)),
        on_lost=lambda _, partitions: owner.partitions_lost(numbers(partitions)),
    )
