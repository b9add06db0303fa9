"""Everything that talks to Kafka through confluent-kafka (librdkafka), except the faust agent."""

from typing import Final

# DESIGN §7: the topic names other people's tools rely on.
INPUT_TOPIC: Final = "agent.ownership.v1"
FINDINGS_TOPIC: Final = "splitbrain.findings.v1"
DLQ_TOPIC: Final = "agent.ownership.dlq.v1"
