"""A critical split-brain reaches the pager: worker metrics -> Prometheus evaluating the shipped
rules -> Alertmanager -> a webhook receiver. Prometheus and Alertmanager are Debian's packages,
run for real on loopback (`.ci/run` installs them; without them the test skips, see
`tests/tools.py`)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from tests.integration.conftest import deploy
from tests.integration.deployment import wait_for
from tests.integration.receiver import Receiver
from tests.paths import ROOT, SEED_FIXTURE
from tests.tools import program

RULES = ROOT / "alerts" / "splitbrain.rules.yml"


@contextmanager
def serving(args: list[str], log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, ready when its /-/ready answers; stopped by its PID."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    return True
            except OSError:
                return False

        wait_for(ready, f"{Path(args[0]).name} to be ready", 60)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_critical_finding_pages_through_prometheus_and_alertmanager(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    prometheus = program("prometheus", package="prometheus")
    alertmanager = program(
        "prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager"
    )
    hook = Receiver()
    am_port, prom_port = free_port(), free_port()
    am_config = write_yaml(
        tmp_path / "alertmanager.yml",
        {
            "route": {
                "receiver": "pager",
                "group_by": ["alertname"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "pager", "webhook_configs": [{"url": hook.url}]}],
        },
    )
    deployment = deploy(kafka_broker, tmp_path, "kafka")
    w = deployment.worker()
    prom_config = write_yaml(
        tmp_path / "prometheus.yml",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
            },
            "scrape_configs": [
                {
                    "job_name": "splitbrain",
                    "static_configs": [{"targets": [f"127.0.0.1:{w.metrics_port}"]}],
                }
            ],
        },
    )
    try:
        with (
            serving(
                [
                    alertmanager,
                    f"--config.file={am_config}",
                    f"--storage.path={tmp_path / 'am'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",  # no gossip port on every interface
                ],
                tmp_path / "alertmanager.log",
                am_port,
            ),
            serving(
                [
                    prometheus,
                    f"--config.file={prom_config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp_path / "prometheus.log",
                prom_port,
            ),
        ):
            # The worker's counters start at 0, so the first critical finding is an increase. The
            # fixture's finding opens at info and reaches critical two revisions later.
            up = f"http://127.0.0.1:{prom_port}/api/v1/query?query=up%7Bjob%3D%22splitbrain%22%7D"

            def scraped() -> bool:
                with urllib.request.urlopen(up, timeout=5) as resp:
                    result = json.loads(resp.read())["data"]["result"]
                return bool(result) and result[0]["value"][1] == "1"

            wait_for(scraped, "Prometheus to scrape the worker", 60, [w])
            replayed = deployment.cli(
                "replay", str(SEED_FIXTURE), "--topic", deployment.topics.input
            )
            assert replayed.returncode == 0, replayed.stderr

            def paged() -> list[dict[str, Any]]:
                return [
                    a
                    for a in hook.alerts()
                    if a["labels"]["alertname"] == "SplitbrainCriticalFinding"
                ]

            wait_for(lambda: bool(paged()), "the critical finding to reach the webhook", 90, [w])
            alert = paged()[0]
            assert alert["status"] == "firing"
            assert alert["labels"] == {
                "alertname": "SplitbrainCriticalFinding",
                "job": "splitbrain",
                "severity": "page",
            }
            notes = alert["annotations"]
            assert notes["runbook_url"] == "docs/operating/alerts.md#splitbraincriticalfinding"
            assert "splitbrain.findings.v1" in notes["description"]
    finally:
        deployment.close()
        hook.close()
