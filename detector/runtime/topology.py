"""The topics a worker reads and writes, checked before it starts, whichever runtime runs it.

Findings and dead letters go to the partition of the input record they come from, and the
changelog is co-partitioned with the input, so each output needs at least as many partitions as
the input (topics.yaml gives them the same) and the changelog exactly as many.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from detector.kafka.config import fetch_metadata
from detector.kafka.stateful.topics import TopologyError, check_copartitioned, source_shape
from detector.runtime.settings import WorkerSettings


def inspect_topics(admin: AdminClient, settings: WorkerSettings) -> tuple[int, int]:
    """Partition count and replication factor of the input, checked against the outputs."""
    topics = fetch_metadata(admin, 30.0).topics
    partitions, replication = source_shape(topics, settings.input_topic, "input")
    for name in (settings.findings_topic, settings.dlq_topic):
        topic = topics.get(name)
        if topic is None or topic.error is not None:
            raise TopologyError(f"output topic {name!r} does not exist")
        if len(topic.partitions) < partitions:
            raise TopologyError(
                f"{name!r} has {len(topic.partitions)} partitions, fewer than the input's "
                f"{partitions}: it must be co-partitioned with {settings.input_topic!r}"
            )
    check_copartitioned(topics, settings.changelog_topic, settings.input_topic, partitions)
    return partitions, replication
