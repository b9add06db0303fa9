"""Whether the cluster serves a set of topics: every broker it lists answers, and every partition
is led, with enough replicas in sync to take a write acknowledged by all of them.

The worker asks this only while a commit is blocked past its own timeout: a cluster that serves
every partition the transaction needs means the client, not the brokers, is what waits. The
brokers are dialled too, because metadata alone can lie: with two controllers of three down, no
one updates it, and it still shows the dead brokers leading and in sync.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata  # type: ignore[attr-defined]

# The internal topics a transaction writes to: its state, and the group's offsets (KIP-447).
TRANSACTION_TOPICS: Final = ("__transaction_state", "__consumer_offsets")
_IN_SYNC: Final = 2  # every topics/topics.yaml profile with replicas asks min.insync.replicas 2


def serves(admin: AdminClient, topics: Iterable[str], timeout: float = 5.0) -> bool:
    """True when every broker in the metadata accepts a connection and each partition of every
    topic in `topics` has a leader and at least min(2, replicas) replicas in sync; False on any
    error or missing topic."""
    for name in topics:
        try:
            metadata = admin.list_topics(name, timeout=timeout)
        except KafkaException:
            return False
        if not _led_in_sync(metadata, name):
            return False
    return _brokers_answer(metadata, timeout)


def _led_in_sync(metadata: ClusterMetadata, name: str) -> bool:
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None or not topic.partitions:
        return False
    return all(
        p.error is None and p.leader >= 0 and len(p.isrs) >= min(_IN_SYNC, len(p.replicas))
        for p in topic.partitions.values()
    )


def _brokers_answer(metadata: ClusterMetadata, timeout: float) -> bool:
    for broker in metadata.brokers.values():
        try:
            socket.create_connection((broker.host, broker.port), timeout=timeout).close()
        except OSError:
            return False
    return True
