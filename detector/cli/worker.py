"""`splitbrain worker`: run a detector worker in the consumer group until SIGTERM."""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Final

from pydantic import Field, create_model

from detector.core import Bound, Config, Detector
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.runtime.settings import TRANSACTION_TIMEOUT_MS, WorkerSettings
from detector.settings import (
    CommandSettings,
    PositiveInt,
    PositiveSeconds,
    Seconds,
    SettingsError,
    declared_fields,
)
from detector.telemetry.metrics import WorkerMetrics

if TYPE_CHECKING:
    from detector.runtime.kafka_loop import KafkaLoopWorker

# The form of an engine setting's flag, by its bound: caps and counts are whole numbers, the
# rest are periods in seconds.
_FORMS: Final = {
    Bound.AT_LEAST_ONE: PositiveInt,
    Bound.MORE_THAN_ZERO: PositiveSeconds,
    Bound.NOT_NEGATIVE: Seconds,
}
_ENGINE: Final[dict[str, Any]] = {
    f.name: (_FORMS[f.metadata["bound"]], Field(f.default, description=f.metadata["meaning"]))
    for f in fields(Config)
}
_OWN: Final = declared_fields(WorkerSettings)


class _Worker(CommandSettings):
    """The command's checks across settings; its fields are `WorkerSettings`' and `Config`'s."""

    def worker_settings(self, kafka: dict[str, Any]) -> WorkerSettings:
        """What either runtime reads, with `kafka` from `KafkaConnection.client_config`;
        a `SettingsError` for a guarantee the runtime does not give."""
        settings = WorkerSettings(
            kafka=kafka,
            engine=Config(**{name: getattr(self, name) for name in _ENGINE}),
            **{name: getattr(self, name) for name in _OWN},
        )
        if settings.runtime == "faust" and settings.processing_guarantee != "exactly-once":
            raise SettingsError(
                f"{self.named('processing_guarantee')}: expected exactly-once with "
                f"{self.named('runtime')} (only the kafka runtime writes at least once)"
            )
        if settings.runtime == "faust" and settings.standby != "off":
            raise SettingsError(
                f"{self.named('standby')}: expected off with {self.named('runtime')} "
                "(standbys are the kafka runtime's)"
            )
        timeout = settings.transaction_timeout_ms
        if settings.runtime == "faust" and timeout != TRANSACTION_TIMEOUT_MS:
            raise SettingsError(
                f"{self.named('transaction_timeout_ms')}: expected {TRANSACTION_TIMEOUT_MS} with "
                f"{self.named('runtime')} (faust's transactions keep aiokafka's 60 s)"
            )
        return settings


WorkerCommandSettings: Final = create_model(
    "WorkerCommandSettings", __base__=_Worker, **_OWN, **_ENGINE
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


def run_worker(
    args: argparse.Namespace,
    engine: type[Detector],
    kafka_loop: type[KafkaLoopWorker] | None = None,
) -> int:
    """The worker of the parsed `args`, whose partitions each run an `engine` (a test's can
    raise on purpose: `detector.testing.faulty_worker`); the kafka runtime's loop is
    `kafka_loop` if given (a test's can stall on purpose: `detector.testing.stalling_worker`)."""
    options = WorkerCommandSettings.from_args(args)
    settings = options.worker_settings(KafkaConnection.from_args(args).client_config())
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)  # faust and rocksdb write there
    except OSError as exc:
        raise SettingsError(
            f"{options.named('state_dir')}: cannot create the directory: {exc.strerror}"
        ) from None
    metrics = WorkerMetrics(max_label_values=settings.engine.max_label_values)
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.metrics_address)
    if settings.runtime == "faust":
        from detector.runtime.faust import run_faust_worker  # noqa: PLC0415

        return run_faust_worker(settings, metrics, engine)
    from detector.runtime.kafka_loop import run_kafka_loop  # noqa: PLC0415

    return run_kafka_loop(settings, metrics, engine, kafka_loop)
