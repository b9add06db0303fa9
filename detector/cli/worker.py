"""`splitbrain worker`: run a detector worker in the consumer group until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, create_model

from detector.contracts.topics import DLQ_TOPIC, FINDINGS_TOPIC, GROUP_ID, INPUT_TOPIC
from detector.core import Config, Detector
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.runtime.settings import Guarantee, StoreKind, WorkerSettings
from detector.settings import (
    CommandSettings,
    Directory,
    Form,
    IpAddress,
    LogLevel,
    Name,
    Port,
    PositiveInt,
    PositiveSeconds,
    Seconds,
    SettingsError,
)
from detector.telemetry.metrics import WorkerMetrics


def _instance_id(text: str) -> str:
    if text in (".", "..") or not _INSTANCE_ID.fullmatch(text):
        raise ValueError("not an instance id")
    return text


# Kafka's rule for a group.instance.id; the transactional id and the state directory take it too.
_INSTANCE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
InstanceId = Annotated[
    str,
    AfterValidator(_instance_id),
    Form("1 to 249 letters, digits, '.', '_' or '-' (not . or ..)", "NAME"),
]


# Every engine setting (`detector.core.Config`): its form, which is Config's rule (caps and counts
# from 1, the periods it cannot do without more than 0), and its help.
_ENGINE: Final[dict[str, tuple[Any, str]]] = {
    "max_evidence": (
        PositiveInt,
        "raw events kept per workflow for a late acquisition to look back at",
    ),
    "max_acquisitions": (PositiveInt, "acquisitions kept per workflow"),
    "max_effect_keys": (PositiveInt, "effect keys kept per workflow and tracked per finding"),
    "max_event_ids": (PositiveInt, "event ids remembered per workflow to recognise a redelivery"),
    "quiet_period_s": (
        PositiveSeconds,
        "silence (this worker's clock) that counts as fenced, in seconds",
    ),
    "clock_skew_s": (
        PositiveSeconds,
        "audit only: how far ahead an uncorroborated observed_at is still believed, in seconds",
    ),
    "idle_ttl_s": (
        PositiveSeconds,
        "a workflow with no events for this long is forgotten, in seconds",
    ),
    "idle_sweep_s": (Seconds, "how often every workflow is checked for idleness, in seconds"),
    "remnant_ttl_s": (
        PositiveSeconds,
        "a forgotten workflow's remnant is removed this long after it was made, in seconds; at "
        "least the findings topic's retention.ms + segment.ms, so no reader still sees the "
        "revisions of its findings",
    ),
    "missed_heartbeats": (PositiveInt, "R of the lease rule L > (R+1) x H + J"),
    "jitter_reserve_s": (Seconds, "J of the lease rule L > (R+1) x H + J, in seconds"),
    "max_label_values": (
        PositiveInt,
        "distinct values kept per lease-health metric label (tool_class, model, provider); "
        "the rest are counted as other",
    ),
}


class _Worker(CommandSettings):
    """The worker's own settings; the engine's are added from `_ENGINE` below."""

    runtime: Literal["kafka", "faust"] = Field(
        "kafka", description="stream runtime: kafka (confluent-kafka transactions) or faust"
    )
    group_id: Name = Field(GROUP_ID, description="consumer group; also names the changelog topic")
    instance_id: InstanceId = Field(
        default_factory=socket.gethostname,
        description="stable name of this worker slot: the transactional id's suffix (a restarted "
        "worker fences its previous incarnation). Give each worker its own; default: the host name",
    )
    input_topic: Name = Field(INPUT_TOPIC, description="topic of ownership events")
    findings_topic: Name = Field(FINDINGS_TOPIC, description="topic of finding revisions")
    dlq_topic: Name = Field(DLQ_TOPIC, description="topic of dead letters")
    commit_interval_ms: PositiveInt = Field(
        100, description="commit the transaction at least this often, in milliseconds"
    )
    commit_max_events: PositiveInt = Field(5000, description="or after this many input records")
    commit_give_up_s: Seconds = Field(
        300.0,
        description="kafka runtime: a commit that has waited for Kafka this long ends the worker "
        "(status 1) for its supervisor to start a fresh one, which looks the coordinators up "
        "again (librdkafka can wait for ever on a group coordinator whose broker is gone for "
        "good); nothing is lost or written twice. A commit past its own 30 s timeout while the "
        "cluster has served every partition the transaction needs for 20 s ends it sooner. 0: "
        "wait for ever. In seconds",
    )
    processing_guarantee: Guarantee = Field(
        "exactly-once",
        description="exactly-once: one Kafka transaction per batch, so a (finding_id, revision) "
        "pair is never produced twice; at-least-once (kafka runtime only): no transactions, so a "
        "crash or rebalance can produce a pair again, and a worker paused past its session is not "
        "fenced: the stale state it writes on waking can hide a later finding. Not for paging: "
        "it is there to measure what the transactions cost",
    )
    state_dir: Directory = Field(Path("var/state"), description="local state; created if missing")
    store: StoreKind = Field(
        "memory",
        description="local store of workflow states: memory, or rocksdb on --state-dir (needs "
        "the rocksdb extra); both are rebuilt from the changelog",
    )
    metrics_port: Port = Field(0, description="serve /metrics on this port (0: off)")
    metrics_address: IpAddress = Field(
        "127.0.0.1",
        description="the address /metrics listens on; 0.0.0.0 (or ::) for a scraper in another "
        "container or host, behind a network policy or firewall",
    )
    log_level: LogLevel = Field("INFO", description="log level")

    def worker_settings(self, kafka: dict[str, Any]) -> WorkerSettings:
        """What either runtime reads, with `kafka` from `KafkaConnection.client_config`;
        a `SettingsError` for a guarantee the runtime does not give."""
        if self.runtime == "faust" and self.processing_guarantee != "exactly-once":
            raise SettingsError(
                f"{self.named('processing_guarantee')}: expected exactly-once with "
                f"{self.named('runtime')} (only the kafka runtime writes at least once)"
            )
        return WorkerSettings(
            kafka=kafka,
            instance_id=self.instance_id,
            input_topic=self.input_topic,
            findings_topic=self.findings_topic,
            dlq_topic=self.dlq_topic,
            group_id=self.group_id,
            commit_interval_ms=self.commit_interval_ms,
            commit_max_events=self.commit_max_events,
            commit_give_up_s=self.commit_give_up_s or None,
            processing_guarantee=self.processing_guarantee,
            state_dir=self.state_dir,
            store=self.store,
            metrics_port=self.metrics_port or None,
            engine=Config(**{name: getattr(self, name) for name in _ENGINE}),
        )


_DEFAULTS: Final = Config()
_ENGINE_FIELDS: Final[dict[str, Any]] = {
    name: (kind, Field(getattr(_DEFAULTS, name), description=text))
    for name, (kind, text) in _ENGINE.items()
}
WorkerCommandSettings: Final = create_model(
    "WorkerCommandSettings", __base__=_Worker, **_ENGINE_FIELDS
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run a detector worker: consume ownership events, publish findings (exactly once)",
        description="Consume agent.ownership.v1 in a consumer group, keep per-workflow state in "
        "a changelog-backed table and publish finding revisions transactionally. Each flag "
        "also reads SPLITBRAIN_<NAME> from the environment; the flag wins. Exit 0 after SIGTERM; "
        "1: crashed, or gave up on a commit (--commit-give-up-s); 2: a flag, a variable or the "
        "topics cannot be used; 3: fenced by a newer owner.",
    )
    add_kafka_arguments(p)
    WorkerCommandSettings.add_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return run_worker(args, Detector)


def run_worker(args: argparse.Namespace, engine: type[Detector]) -> int:
    """The worker of the parsed `args`, whose partitions each run an `engine` (a test's can
    raise on purpose: `detector.testing.faulty_worker`)."""
    options = WorkerCommandSettings.from_args(args)
    logging.basicConfig(
        level=options.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = options.worker_settings(KafkaConnection.from_args(args).client_config())
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)  # faust and rocksdb write there
    except OSError as exc:
        raise SettingsError(
            f"{options.named('state_dir')}: cannot create the directory: {exc.strerror}"
        ) from None
    metrics = WorkerMetrics(max_label_values=settings.engine.max_label_values)
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, options.metrics_address)
    if options.runtime == "faust":
        from detector.runtime.faust import run_faust_worker  # noqa: PLC0415

        return run_faust_worker(settings, metrics, engine)
    from detector.runtime.kafka_loop import run_kafka_loop  # noqa: PLC0415

    return run_kafka_loop(settings, metrics, engine)
