"""What a detector worker needs to know, whichever runtime runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from detector.contracts.topics import (
    DLQ_TOPIC,
    FINDINGS_TOPIC,
    GROUP_ID,
    INPUT_TOPIC,
    changelog_topic,
)
from detector.core import Config


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """`kafka` is the librdkafka client config (bootstrap and security) of `detector.kafka.config`.

    `instance_id` names this worker's slot: it is part of the transactional id, so a restarted
    worker fences its own previous incarnation at once instead of waiting for a timeout.
    """

    kafka: dict[str, Any]
    instance_id: str
    input_topic: str = INPUT_TOPIC
    findings_topic: str = FINDINGS_TOPIC
    dlq_topic: str = DLQ_TOPIC
    group_id: str = GROUP_ID
    commit_interval_ms: int = 100
    commit_max_events: int = 5000
    state_dir: Path = Path("var/state")
    store: Literal["memory", "rocksdb"] = "memory"
    metrics_port: int | None = None
    engine: Config = field(default_factory=Config)

    @property
    def changelog_topic(self) -> str:
        return changelog_topic(self.group_id)

    @property
    def transactional_id(self) -> str:
        return f"{self.group_id}-{self.instance_id}"
