"""DESIGN §7: the topic names and the consumer group other people's tools rely on."""

from typing import Final

INPUT_TOPIC: Final = "agent.ownership.v1"
FINDINGS_TOPIC: Final = "splitbrain.findings.v1"
DLQ_TOPIC: Final = "agent.ownership.dlq.v1"
GROUP_ID: Final = "splitbrain-detector"


def changelog_topic(group_id: str) -> str:
    """Compacted, co-partitioned with the input: the state table's only durable copy. faust
    derives the same name from its app id and table name, so both runtimes share one."""
    return f"{group_id}-state-changelog"
