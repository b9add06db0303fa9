"""`splitbrain worker`: run a detector worker in the consumer group until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Final

from detector.cli.arguments import port, positive_int, seconds
from detector.contracts.topics import DLQ_TOPIC, FINDINGS_TOPIC, GROUP_ID, INPUT_TOPIC
from detector.core import Config
from detector.errors import ExitCode
from detector.kafka.config import add_kafka_arguments, client_config, reports_kafka_errors
from detector.runtime.settings import WorkerSettings
from detector.telemetry.metrics import WorkerMetrics

RUNTIMES = ("kafka", "faust")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"SPLITBRAIN_{name}", default)


# One line per engine setting (`detector.core.Config`): each is a flag and a variable.
_ENGINE_HELP: Final = {
    "max_evidence": "raw events kept per workflow for a late acquisition to look back at",
    "max_acquisitions": "acquisitions kept per workflow",
    "max_effect_keys": "effect keys kept per workflow and tracked per finding",
    "max_event_ids": "event ids remembered per workflow to recognise a redelivery",
    "quiet_period_s": "silence (this worker's clock) that counts as fenced, in seconds",
    "clock_skew_s": "audit only: how far ahead an uncorroborated observed_at is still believed",
    "idle_ttl_s": "a workflow with no events for this long is forgotten, in seconds",
    "idle_sweep_s": "how often every workflow is checked for idleness, in seconds",
    "missed_heartbeats": "R of the lease rule L > R x H + J",
    "jitter_reserve_s": "J of the lease rule L > R x H + J, in seconds",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run a detector worker: consume ownership events, publish findings (exactly once)",
        description="Consume agent.ownership.v1 in a consumer group, keep per-workflow state in "
        "a changelog-backed table and publish finding revisions transactionally. Each flag "
        "also reads SPLITBRAIN_<NAME> from the environment.",
    )
    add_kafka_arguments(p)
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=_env("RUNTIME", "kafka"),
        help="stream runtime (default kafka: confluent-kafka transactions)",
    )
    p.add_argument("--group-id", default=_env("GROUP_ID", GROUP_ID))
    p.add_argument(
        "--instance-id",
        default=_env("INSTANCE_ID", socket.gethostname()),
        help="stable name of this worker slot; part of the transactional id "
        "(default: the host name)",
    )
    p.add_argument("--input-topic", default=_env("INPUT_TOPIC", INPUT_TOPIC))
    p.add_argument("--findings-topic", default=_env("FINDINGS_TOPIC", FINDINGS_TOPIC))
    p.add_argument("--dlq-topic", default=_env("DLQ_TOPIC", DLQ_TOPIC))
    # String defaults from the environment go through `type` only when this command runs, so
    # a bad variable names its flag here and never breaks another command.
    p.add_argument(
        "--commit-interval-ms",
        type=positive_int,
        default=_env("COMMIT_INTERVAL_MS", "100"),
        help="commit the transaction at least this often (default 100)",
    )
    p.add_argument(
        "--commit-max-events",
        type=positive_int,
        default=_env("COMMIT_MAX_EVENTS", "5000"),
        help="or after this many input records (default 5000)",
    )
    p.add_argument("--state-dir", type=Path, default=Path(_env("STATE_DIR", "var/state") or "."))
    p.add_argument(
        "--store",
        choices=("memory", "rocksdb"),
        default=_env("STORE", "memory"),
        help="local store of workflow states: memory (default) or rocksdb on "
        "--state-dir (needs the rocksdb extra); both are rebuilt from the changelog",
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        default=_env("METRICS_PORT", "0"),
        help="serve /metrics on 127.0.0.1:PORT (0: off)",
    )
    defaults = Config()
    for f in fields(Config):
        default = getattr(defaults, f.name)
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"engine_{f.name}",
            type=positive_int if isinstance(default, int) else seconds,
            default=_env(f.name.upper(), str(default)),
            metavar="N" if isinstance(default, int) else "S",
            help=f"{_ENGINE_HELP[f.name]} (default {default:g})",
        )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"))
    p.set_defaults(run=run)


@reports_kafka_errors("worker")
def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        engine = Config(**{f.name: getattr(args, f"engine_{f.name}") for f in fields(Config)})
    except ValueError as exc:
        name = str(exc).split()[0]
        print(f"splitbrain worker: --{name.replace('_', '-')}: {exc}", file=sys.stderr)
        return ExitCode.UNUSABLE
    settings = WorkerSettings(
        kafka=client_config(args),
        instance_id=args.instance_id,
        input_topic=args.input_topic,
        findings_topic=args.findings_topic,
        dlq_topic=args.dlq_topic,
        group_id=args.group_id,
        commit_interval_ms=args.commit_interval_ms,
        commit_max_events=args.commit_max_events,
        state_dir=args.state_dir,
        store=args.store,
        metrics_port=args.metrics_port or None,
        engine=engine,
    )
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)  # faust and rocksdb write there
    except OSError as exc:
        print(
            f"splitbrain worker: --state-dir {settings.state_dir}: {exc.strerror}", file=sys.stderr
        )
        return ExitCode.UNUSABLE
    metrics = WorkerMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    if args.runtime == "faust":
        from detector.runtime.faust import run_faust_worker  # noqa: PLC0415

        return run_faust_worker(settings, metrics)
    from detector.runtime.kafka_loop import run_kafka_loop  # noqa: PLC0415

    return run_kafka_loop(settings, metrics)
