"""What a detector worker needs to know, whichever runtime runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from detector.contracts.topics import changelog_topic
from detector.core import Config

# Which `detector.runtime.store.Store` a worker keeps its workflow states in.
StoreKind = Literal["memory", "rocksdb"]
Guarantee = Literal["exactly-once", "at-least-once"]


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Every value is given: the worker command's settings (`detector.cli.worker`) own the
    defaults, the flags and the variables, and check each value before a runtime starts.

    `kafka` is the librdkafka client config (bootstrap and security) of `detector.kafka.config`.
    `instance_id` names this worker's slot: it is part of the transactional id, so a restarted
    worker fences its own previous incarnation at once instead of waiting for a timeout.
    `commit_give_up_s`: a commit waiting for Kafka this long ends the kafka runtime's process
    (None: it waits for ever; `detector.runtime.stall`).
    `processing_guarantee` at-least-once (kafka runtime only) gives up the transactions, and with
    them the promise that a (finding_id, revision) pair is never written twice.
    """

    kafka: dict[str, Any]
    instance_id: str
    input_topic: str
    findings_topic: str
    dlq_topic: str
    group_id: str
    commit_interval_ms: int
    commit_max_events: int
    commit_give_up_s: float | None
    processing_guarantee: Guarantee
    state_dir: Path
    store: StoreKind
    metrics_port: int | None
    engine: Config

    @property
    def changelog_topic(self) -> str:
        return changelog_topic(self.group_id)

    @property
    def transactional_id(self) -> str:
        return f"{self.group_id}-{self.instance_id}"
