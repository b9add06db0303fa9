"""`splitbrain tail`: follow the findings topic and show what the on-call human would see.

It reads with `isolation.level=read_committed`, because the detector publishes findings inside
Kafka transactions: a finding from an aborted transaction (a fenced zombie detector, a crash
before commit) never happened and must not be shown. Without `--group-id` it assigns every
partition itself, so looking at findings never joins, rebalances or commits for a real group.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import uuid
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Message, TopicPartition
from pydantic import ValidationError

from detector.cli.arguments import positive_seconds
from detector.contracts.findings import Finding
from detector.contracts.topics import FINDINGS_TOPIC
from detector.errors import ExitCode
from detector.kafka.config import (
    KafkaClientError,
    KafkaConnection,
    add_kafka_arguments,
    fetch_metadata,
    reports_kafka_errors,
)
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


@reports_kafka_errors("tail")
def run(args: argparse.Namespace) -> int:
    view = FindingsView()
    consumer = findings_consumer(
        KafkaConnection.from_args(args).client_config(),
        args.topic,
        from_beginning=args.from_beginning,
        group_id=args.group_id,
    )
    idle_timeout = math.inf if args.idle_timeout is None else args.idle_timeout
    idle_since = time.monotonic()
    try:
        while True:
            msg = consumer.poll(POLL_INTERVAL)
            if msg is None:
                if not consumer.assignment():
                    idle_since = time.monotonic()  # still joining the group: not idle yet
                elif time.monotonic() - idle_since >= idle_timeout:
                    break
                continue
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaClientError(f"Kafka: {err.str()}")
                print(f"splitbrain tail: {err.str()}", file=sys.stderr)
                continue
            idle_since = time.monotonic()
            finding = view.add(msg)
            if finding is not None and args.format == "text":
                print(one_line(finding), flush=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a tail without --idle-timeout ends: still print what it saw
    finally:
        consumer.close()
    if args.format == "json":
        for f in view.findings.values():
            print(f.to_json())
    else:
        print("\n" + summary(view, args.topic), end="")
    return ExitCode.OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "tail",
        help="follow the findings topic (committed findings only)",
        description="Read findings as the detector commits them and keep the latest revision "
        "of each. Text: one line per revision as it arrives, then a report on exit. JSON: the "
        "latest revision of each finding, one object per line, on exit.",
    )
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the oldest retained finding, not at new ones",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="the report audit prints (default) or the latest revision of each finding as JSONL",
    )
    p.add_argument(
        "--idle-timeout",
        type=positive_seconds,
        metavar="S",
        help="exit after S seconds without a new record (default: run until Ctrl-C)",
    )
    p.add_argument(
        "--topic", default=FINDINGS_TOPIC, metavar="NAME", help="the topic of finding revisions"
    )
    p.add_argument(
        "--group-id",
        metavar="NAME",
        help="consume as this consumer group (committing its position) instead of assigning "
        "every partition; --from-beginning then applies only while the group has no position",
    )
    add_kafka_arguments(p)
    p.set_defaults(run=run)
