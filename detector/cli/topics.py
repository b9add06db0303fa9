"""`splitbrain topics apply`: make the cluster's topics match `topics/topics.yaml` (the one the
package bundles, unless `--file` names another)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient

from detector import bundled
from detector.cli.arguments import positive_seconds
from detector.errors import ExitCode
from detector.kafka.admin import Plan, execute, load_topics, plan
from detector.kafka.config import KafkaConnection, add_kafka_arguments


def print_plan(todo: Plan) -> None:
    for t in todo.create:
        settings = " ".join(f"{k}={v}" for k, v in t.config.items())
        print(
            f"create {t.name} partitions={t.partitions} "
            f"replication_factor={t.replication_factor} {settings}"
        )
    for d in todo.drift:
        current = "(unset)" if d.current is None else d.current
        print(f"drift {d.topic} {d.key}: current={current} wanted={d.wanted}")
    for warning in todo.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def run_apply(args: argparse.Namespace) -> int:
    kafka = KafkaConnection.from_args(args).client_config()
    topics = load_topics(args.file or bundled.resource(bundled.TOPICS), args.profile)
    # log_level 5 (notice): at exit librdkafka may note at info level that it dropped an admin
    # event nobody waits for any more, which is noise on an operator's terminal.
    admin = AdminClient({**kafka, "log_level": 5})
    todo = plan(admin, topics, args.timeout)
    print_plan(todo)
    if todo.empty:
        print("no changes")
    else:
        execute(admin, todo, args.timeout, validate_only=args.dry_run)
        counts = f"{len(todo.create)} topic(s) to create, {len(todo.drift)} config(s) to set"
        print(
            f"dry run: {counts}; the broker accepts them; nothing changed"
            if args.dry_run
            else f"applied: {counts}"
        )
    return ExitCode.FAILED if todo.warnings else ExitCode.OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = subparsers.add_parser("topics", help="manage the Kafka topics splitbrain uses")
    actions = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "apply",
        help="create missing topics and fix config drift (never deletes)",
        description="Make the cluster's topics match the topics file. Exit 0: they match (or "
        "now do); 1: a partition count or replication factor differs and was left alone; "
        "2: the file or the cluster cannot be used.",
    )
    p.add_argument(
        "--file",
        type=Path,
        metavar="FILE",
        help=f"topic definitions (default: the bundled {bundled.TOPICS}, which `splitbrain "
        "export topics DIR` writes out)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME",
        help="apply a profile's overrides from the file (e.g. `local` for a one-node broker)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the changes, make none")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="S",
        help="seconds to wait for each Kafka request",
    )
    add_kafka_arguments(p)
    p.set_defaults(run=run_apply)
