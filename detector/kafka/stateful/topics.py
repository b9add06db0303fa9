"""The state topic beside a consumer's source topic: checked at start, created when missing.

It is compacted (a key's latest record is its state) and co-partitioned with the source: the
state of a source partition's keys goes to the state partition of the same number, so a consumer
restores exactly the state of the partitions it is assigned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    ConfigResource,
    NewTopic,
    TopicMetadata,
)

from detector.errors import SplitbrainError
from detector.kafka.config import fetch_metadata

_TIMEOUT_S: Final = 30.0

log = logging.getLogger(__name__)


class TopologyError(SplitbrainError, RuntimeError):
    """A topic is missing, or partitioned or configured so that what a consumer writes to it
    would be misplaced or lost."""


def source_shape(topics: Mapping[str, TopicMetadata], name: str, role: str) -> tuple[int, int]:
    """Partition count and replication factor of the topic a consumer reads (`role` names it in
    the error)."""
    source = topics.get(name)
    if source is None or source.error is not None or not source.partitions:
        raise TopologyError(f"{role} topic {name!r} does not exist: run `splitbrain topics apply`")
    return len(source.partitions), len(next(iter(source.partitions.values())).replicas)


def check_copartitioned(
    topics: Mapping[str, TopicMetadata], state: str, source: str, partitions: int
) -> bool:
    """Whether the state topic exists; a `TopologyError` if it does with another partition
    count than its source's."""
    found = topics.get(state)
    if found is None or found.error is not None:
        return False
    if len(found.partitions) != partitions:
        raise TopologyError(
            f"state topic {state!r} has {len(found.partitions)} partitions, {source!r} has "
            f"{partitions}: they must be co-partitioned"
        )
    return True


def ensure_state_topic(
    admin: AdminClient,
    source: str,
    role: str,
    state: str,
    config: Mapping[str, str],
    *,
    older: Mapping[str, str] | None = None,
) -> int:
    """The source topic's partition count. The state topic is created with `config` (which must
    compact it), as many partitions and replicas as the source, when it is missing, or with
    `older` when the broker refuses `config` as invalid (a setting newer than the broker); when
    it is not missing, it is checked for both."""
    topics = fetch_metadata(admin, _TIMEOUT_S).topics
    partitions, replication = source_shape(topics, source, role)
    if check_copartitioned(topics, state, source, partitions):
        _check_compacted(admin, state)
        return partitions
    for attempt in (config, older):
        if attempt is None:
            break
        topic = NewTopic(
            state, num_partitions=partitions, replication_factor=replication, config=dict(attempt)
        )
        try:
            admin.create_topics([topic], request_timeout=_TIMEOUT_S)[state].result()
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError.INVALID_CONFIG and attempt is config and older is not None:
                log.info(
                    "state topic %s: the broker refused %s, creating it with %s",
                    state,
                    dict(config),
                    dict(older),
                )
                continue
            if code != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        break
    _wait_for_partitions(admin, state, partitions)
    return partitions


def _check_compacted(admin: AdminClient, state: str) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, state)
    config = admin.describe_configs([resource], request_timeout=_TIMEOUT_S)[resource].result()
    policy = config["cleanup.policy"].value if "cleanup.policy" in config else "delete"
    if "compact" not in policy.split(","):
        raise TopologyError(
            f"state topic {state!r} has cleanup.policy={policy}: it must be compacted, or the "
            "state of long-lived keys expires with it"
        )


def _wait_for_partitions(admin: AdminClient, topic: str, partitions: int) -> None:
    """Until the metadata shows a topic just created with all its partitions and leaders."""
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        found = fetch_metadata(admin, _TIMEOUT_S, topic).topics.get(topic)
        if (
            found is not None
            and found.error is None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 for p in found.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise TopologyError(f"state topic {topic!r} created but not available in time")
        time.sleep(0.2)
