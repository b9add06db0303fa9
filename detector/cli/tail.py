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

from detector.cli.arguments import add_format, positive_seconds
from detector.contracts.topics import FINDINGS_TOPIC
from detector.errors import ExitCode
from detector.kafka.config import KafkaClientError, KafkaConnection, add_kafka_arguments
from detector.kafka.findings import (
    POLL_INTERVAL,
    FindingsView,
    findings_consumer,
    one_line,
    summary,
)


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
    add_format(
        p, "the report audit prints (default) or the latest revision of each finding as JSONL"
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
