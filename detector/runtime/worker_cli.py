"""`splitbrain worker`: run a detector worker in the consumer group until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import Any

from detector.core import Config
from detector.kafka.config import add_kafka_arguments, client_config, reports_kafka_errors
from detector.runtime.settings import (
    DLQ_TOPIC,
    FINDINGS_TOPIC,
    GROUP_ID,
    INPUT_TOPIC,
    WorkerSettings,
)
from detector.telemetry.metrics import WorkerMetrics

RUNTIMES = ("kafka", "faust")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"SPLITBRAIN_{name}", default)


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
    p.add_argument(
        "--commit-interval-ms",
        type=int,
        default=int(_env("COMMIT_INTERVAL_MS", "100") or 100),
        help="commit the transaction at least this often (default 100)",
    )
    p.add_argument(
        "--commit-max-events",
        type=int,
        default=int(_env("COMMIT_MAX_EVENTS", "5000") or 5000),
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
        type=int,
        default=int(_env("METRICS_PORT", "0") or 0),
        help="serve /metrics on 127.0.0.1:PORT (0: off)",
    )
    defaults = Config()
    p.add_argument(
        "--quiet-period-s",
        type=float,
        default=float(_env("QUIET_PERIOD_S", str(defaults.quiet_period_s)) or 0),
        help=f"silence that counts as fenced, in seconds (default {defaults.quiet_period_s:g})",
    )
    p.add_argument(
        "--max-evidence",
        type=int,
        default=int(_env("MAX_EVIDENCE", str(defaults.max_evidence)) or 0),
        help="events retained per workflow for late evidence; activity is dropped first "
        f"(default {defaults.max_evidence})",
    )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"))
    p.set_defaults(run=run)


@reports_kafka_errors("worker")
def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
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
        engine=Config(quiet_period_s=args.quiet_period_s, max_evidence=args.max_evidence),
    )
    metrics = WorkerMetrics()
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    if args.runtime == "faust":
        from detector.runtime.faust_app import run_faust_worker  # noqa: PLC0415

        return run_faust_worker(settings, metrics)
    from detector.runtime.kafka_loop import run_kafka_loop  # noqa: PLC0415

    return run_kafka_loop(settings, metrics)
