"""Reading the findings topic as the on-call human sees it: read_committed (a finding from an
aborted transaction never happened), the latest revision of each finding. Shared by `splitbrain
tail`, the findings view (`splitbrain ui`) and the demo."""

from __future__ import annotations

import sys
import uuid
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Message, TopicPartition
from pydantic import ValidationError

from detector.contracts.findings import Finding
from detector.kafka.config import KafkaClientError, fetch_metadata
from detector.report import finding_lines, printable

METADATA_TIMEOUT: Final = 30.0
POLL_INTERVAL: Final = 0.2


class FindingsView:
    """The latest revision of each finding, in the order findings first appeared."""

    def __init__(self) -> None:
        self.findings: dict[str, Finding] = {}
        self.records = 0
        self.invalid = 0

    def add(self, msg: Message) -> Finding | None:
        """The finding if it is news; None for an invalid record or an older revision."""
        self.records += 1
        try:
            finding = Finding.model_validate_json(msg.value() or b"")
        except ValidationError as exc:
            self.invalid += 1
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "value"
            where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {where}"
            print(printable(f"skipped {where}: {first['msg']}"), file=sys.stderr)
            return None
        known = self.findings.get(finding.finding_id)
        if known is not None and known.revision >= finding.revision:
            return None  # a redelivered or reordered older revision changes nothing
        self.findings[finding.finding_id] = finding
        return finding


def findings_consumer(
    kafka: dict[str, Any], topic: str, *, from_beginning: bool, group_id: str | None = None
) -> Consumer:
    """A read_committed consumer of `topic`, assigned to every partition at the start or the end,
    or subscribed as `group_id`; a `KafkaClientError` when the topic cannot be read."""
    conf = {
        **kafka,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest" if from_beginning else "latest",
        # librdkafka insists on a group id even for assign(); a throwaway one commits nothing.
        "group.id": group_id or f"splitbrain-tail-{uuid.uuid4().hex}",
        "enable.auto.commit": group_id is not None,
    }
    consumer = Consumer(conf)
    metadata = fetch_metadata(consumer, METADATA_TIMEOUT, topic).topics[topic]
    if metadata.error is not None:
        consumer.close()
        raise KafkaClientError(f"cannot read topic {topic}: {metadata.error.str()}")
    if group_id is not None:
        consumer.subscribe([topic])
    else:
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(topic, p, start) for p in metadata.partitions])
    return consumer


def one_line(f: Finding) -> str:
    """One revision as it arrives; escaped, since a workflow key is whatever an emitter sent."""
    kinds = ",".join(c.kind.value for c in f.conditions)
    return printable(
        f"{f.severity.value.upper():8} {f.workflow_key} {f.finding_id} rev {f.revision} "
        f"{f.status.value} confidence={f.confidence} conditions={kinds}"
    )


def summary(view: FindingsView, topic: str) -> str:
    """The latest revisions as `audit` reports findings, under a line that counts records."""
    head = (
        f"splitbrain tail: {view.records} record(s) from {topic}, "
        f"{len(view.findings)} finding(s), {view.invalid} invalid record(s) skipped"
    )
    return "".join(
        printable(line) + "\n" for line in [head, *finding_lines(view.findings.values())]
    )
