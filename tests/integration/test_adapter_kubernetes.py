"""The Kubernetes adapter against a real kube-apiserver (built by
scripts/build-kube-apiserver.sh), a real broker and the detector worker: two Python
leader-election candidates, the leader paused past its lease while the other takes over; the old
leader's work goes on after the takeover until `LeaderElector` stops it, and the findings topic
says so, critical.

Marked `slow`: it needs the built server (skipped, naming the script, when it is not there; a
failure in the slow job, which builds it).
`SPLITBRAIN_RECORD_KUBE=1` writes the watch stream it saw and the input topic it produced to
tests/data/kubernetes/, which the fast suite replays (tests/unit/test_adapter_kubernetes.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel

from detector.devstack.topics import TopicReader
from tests.integration.deployment import Deployment, latest, wait_for
from tests.integration.kafka_harness import REPO, broker_env

pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")

from detector.devstack.kube_apiserver import (
    LocalKubeApiServer,
    LocalKubeApiServerError,
    kube_apiserver_binary,
)

pytestmark = pytest.mark.slow

RECORDED = REPO / "tests" / "data" / "kubernetes"
NAMESPACE = "default"
LEASE = "payments-leader"


@pytest.fixture
def apiserver() -> Iterator[LocalKubeApiServer]:
    try:
        kube_apiserver_binary()
    except LocalKubeApiServerError as exc:
        pytest.skip(str(exc))
    with LocalKubeApiServer() as server:
        yield server


class Process:
    """A subprocess with its output in a file; stopped by PID."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


def test_paused_leader_working_after_the_takeover_is_a_critical_finding(
    kafka_deployment: Deployment, apiserver: LocalKubeApiServer, tmp_path: Path
) -> None:
    env = {**os.environ, **broker_env(kafka_deployment.broker)}
    worker = kafka_deployment.worker()
    recording = tmp_path / "lease-watch.jsonl"
    watcher = Process(
        [
            *(sys.executable, "-m", "detector.cli", "watch", "kubernetes"),
            *("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NAMESPACE),
            *("--lease", LEASE, "--topic", kafka_deployment.topics.input),
            *("--record", str(recording), "--idle-timeout", "30"),
        ],
        env,
        tmp_path / "watch.log",
    )

    def candidate(identity: str) -> Process:
        return Process(
            [
                *(sys.executable, "-m", "detector.demos.kube_candidate"),
                *("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NAMESPACE),
                *(
                    "--lease",
                    LEASE,
                    "--identity",
                    identity,
                    "--topic",
                    kafka_deployment.topics.input,
                ),
            ],
            env,
            tmp_path / f"{identity}.log",
        )

    a = b = None
    try:
        wait_for(lambda: "following leases" in watcher.text(), "the watcher to start")
        a = candidate("pod-a")
        wait_for(lambda: "effect 3 " in a.text(), "pod-a to lead and work")
        b = candidate("pod-b")
        os.kill(a.proc.pid, signal.SIGSTOP)  # pod-a pauses past its 4 s lease
        wait_for(lambda: "effect 1 " in b.text(), "pod-b to take over")
        paused_at = a.text().count("\neffect ")
        os.kill(a.proc.pid, signal.SIGCONT)
        wait_for(lambda: "stopped leading" in a.text(), "pod-a to notice")
        lines = a.text().splitlines()
        stopped = lines.index("stopped leading")
        # Its work went on after the takeover (the zombie), then stopped: at most the effect
        # in flight when the exception was raised in its thread follows the callback.
        assert sum(line.startswith("effect ") for line in lines[:stopped]) > paused_at
        assert sum(line.startswith("effect ") for line in lines[stopped:]) <= 1

        with TopicReader(kafka_deployment.config, kafka_deployment.topics.findings) as findings:

            def critical() -> bool:
                findings.poll(0.2)
                return any(f["severity"] == "critical" for f in latest(findings.records).values())

            wait_for(critical, "a critical finding", workers=[worker])
            found = [f for f in latest(findings.records).values() if f["severity"] == "critical"]
        finding = found[0]
        assert finding["workflow_key"] == f"{NAMESPACE}/{LEASE}"
        assert finding["displaced"]["worker_id"] == "pod-a"
        assert finding["current"]["worker_id"] == "pod-b"
        assert "stale_effect_committed" in {c["kind"] for c in finding["conditions"]}
    finally:
        for p in (b, a, watcher):
            if p is not None:
                p.stop()
    events = [json.loads(line) for line in recording.read_text().splitlines()]
    assert events[0]["type"] == "LIST"
    if os.environ.get("SPLITBRAIN_RECORD_KUBE") == "1":
        RECORDED.mkdir(parents=True, exist_ok=True)
        shutil.copy(recording, RECORDED / "lease-watch.jsonl")
        with TopicReader(
            kafka_deployment.config,
            kafka_deployment.topics.input,
            isolation=IsolationLevel.READ_UNCOMMITTED,
        ) as reader:
            published = reader.read_to_end(30)
        (RECORDED / "input.jsonl").write_bytes(b"".join(r.value + b"\n" for r in published))
