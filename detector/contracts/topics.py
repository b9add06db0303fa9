"""DESIGN §7: the topic names and the consumer group other people's tools rely on."""

from typing import Final

INPUT_TOPIC: Final = "agent.ownership.v1"
FINDINGS_TOPIC: Final = "splitbrain.findings.v1"
DLQ_TOPIC: Final = "agent.ownership.dlq.v1"
GROUP_ID: Final = "splitbrain-detector"
# The pager bridge (`splitbrain page`): its consumer group on the findings topic, and its own
# compacted state topic (key = finding_id, co-partitioned with the findings topic) that keeps
# what it announced to each sink across restarts and beyond the findings topic's retention.
PAGE_GROUP_ID: Final = "splitbrain-page"
PAGE_STATE_TOPIC: Final = "splitbrain.page-state.v1"


def changelog_topic(group_id: str) -> str:
    """Compacted, co-partitioned with the input: the state table's only durable copy. faust
    derives the same name from its app id and table name, so both runtimes share one."""
    return f"{group_id}-state-changelog"
