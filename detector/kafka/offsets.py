"""End offsets, as a reader of one isolation level sees them.

The high watermark (read_uncommitted) counts every record written, decided or not; the last
stable offset (read_committed) stops at the first record of a transaction still open. A
read_committed reader that stops at its end of a partition stops at the latter.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]


def end_offsets(
    admin: AdminClient,
    topic: str,
    partitions: Iterable[int],
    isolation: IsolationLevel,
    timeout: float = 30.0,
) -> dict[int, int]:
    """Per partition of `topic`: the high watermark (READ_UNCOMMITTED) or the last stable offset
    (READ_COMMITTED)."""
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(topic, p): latest for p in partitions}
    if not request:
        return {}
    futures = admin.list_offsets(request, isolation_level=isolation, request_timeout=timeout)
    return {tp.partition: future.result(timeout).offset for tp, future in futures.items()}
