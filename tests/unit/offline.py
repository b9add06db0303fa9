"""What the runtimes' tests with no broker build a worker from."""

from __future__ import annotations

from pathlib import Path

from detector.core import Config
from detector.runtime.settings import WorkerSettings

INPUT = "wf.in"


def offline_settings(state_dir: Path) -> WorkerSettings:
    """A worker's settings whose broker is never connected to."""
    return WorkerSettings(
        kafka={"bootstrap.servers": "127.0.0.1:9", "log_level": 0},  # nothing answers, quietly
        instance_id="w1",
        input_topic=INPUT,
        findings_topic="wf.findings",
        dlq_topic="wf.dlq",
        group_id="g",
        commit_interval_ms=100,
        commit_max_events=1000,
        commit_give_up_s=None,
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        store="memory",
        metrics_port=None,
        engine=Config(),
    )
