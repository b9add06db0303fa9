"""A `splitbrain worker` process for the benchmarks, on topics the caller created."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def start_worker(
    bootstrap: str, tag: str, topics: tuple[str, str, str], *extra: str
) -> subprocess.Popen[bytes]:
    """Input, findings and DLQ topics in that order; logs at WARNING so that they cost nothing."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "detector.cli",
            "worker",
            "--bootstrap-servers",
            bootstrap,
            "--instance-id",
            tag,
            "--group-id",
            f"bench-{tag}",
            "--input-topic",
            topics[0],
            "--findings-topic",
            topics[1],
            "--dlq-topic",
            topics[2],
            "--log-level",
            "WARNING",
            *extra,
        ],
        start_new_session=True,
    )


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait(60)
