"""The topics a worker reads and writes, checked before it starts, whichever runtime runs it.

Findings and dead letters go to the partition of the input record they come from, and the
changelog is co-partitioned with the input, so each output needs at least as many partitions as
the input (topics.yaml gives them the same) and the changelog exactly as many.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from detector.errors import SplitbrainError
from detector.kafka.config import fetch_metadata
from detector.runtime.settings import WorkerSettings


class TopologyError(SplitbrainError, RuntimeError):
    """A topic is missing or partitioned so that the worker's output would be misplaced."""


def inspect_topics(admin: AdminClient, settings: WorkerSettings) -> tuple[int, int]:
    """Partition count and replication factor of the input, checked against the outputs."""
    topics = fetch_metadata(admin, 30.0).topics
    source = topics.get(settings.input_topic)
    if source is None or source.error is not None or not source.partitions:
        raise TopologyError(
            f"input topic {settings.input_topic!r} does not exist: run `splitbrain topics apply`"
        )
    partitions = len(source.partitions)
    replication = len(next(iter(source.partitions.values())).replicas)
    for name in (settings.findings_topic, settings.dlq_topic):
        topic = topics.get(name)
        if topic is None or topic.error is not None:
            raise TopologyError(f"output topic {name!r} does not exist")
        if len(topic.partitions) < partitions:
            raise TopologyError(
                f"{name!r} has {len(topic.partitions)} partitions, fewer than the input's "
                f"{partitions}: it must be co-partitioned with {settings.input_topic!r}"
            )
    changelog = topics.get(settings.changelog_topic)
    if (
        changelog is not None
        and changelog.error is None
        and len(changelog.partitions) != partitions
    ):
        raise TopologyError(
            f"changelog {settings.changelog_topic!r} has {len(changelog.partitions)} partitions,"
            f" the input has {partitions}"
        )
    return partitions, replication
