"""The documentation's Kafka ACLs are all each component needs, and its emit example runs as
written.

A broker with the ACL authorizer on and SASL_SSL users that have no permission at all; the
`kafka-acls.sh` block of docs/operating/security.md runs as written (with `kafka-acls.sh` being
Kafka's own tool from the broker's jars); then a worker, the pager bridge and an emitter each run
as their principal, under the default topic and group names the block grants, and the acceptance
history's critical finding must reach the findings topic and the bridge's webhook, and a
principal must be refused what it was not granted.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer

from detector.contracts.topics import DLQ_TOPIC, FINDINGS_TOPIC, INPUT_TOPIC
from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import WorkerTopics, read_committed
from detector.devstack.worker import WorkerProcess, connection_env
from tests.integration.deployment import latest, wait_for
from tests.integration.kafka_harness import splitbrain
from tests.integration.receiver import Receiver
from tests.paths import ROOT, SEED_FIXTURE

SECURITY = ROOT / "docs" / "operating" / "security.md"
EMITTER = ROOT / "docs" / "adapters" / "emitter.md"
EMIT_HEADING = "# Emitting events from your own workers: `detector.kafka.emit`"
WORKER, PAGER, AGENTS = "splitbrain-detector", "splitbrain-page", "agents"


def doc_block(page: Path, heading: str, language: str) -> str:
    """The first fenced `language` block under `heading` of a documentation page."""
    text = page.read_text(encoding="utf-8")
    section = text[text.index(f"{heading}\n") :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"{page.name}: no {language} block under {heading}"
    return match[1]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(
        tmp_path_factory.mktemp("kafka-acls"), sasl_ssl=True, acl_users=(WORKER, PAGER, AGENTS)
    )
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def grant_as_the_docs_say(broker: LocalKafka, workdir: Path) -> None:
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "kafka-acls.sh"
    tool.write_text(f'#!/bin/sh\nexec {shlex.join(broker.kafka_acls_argv())} "$@"\n')
    tool.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KAFKA": broker.bootstrap,
        "ADMIN": str(broker.java_admin_config()),
    }
    script = "set -eu\n" + doc_block(SECURITY, "## Kafka ACLs", "sh")
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"the documented ACL commands failed:\n{done.stdout}{done.stderr}"


def refused(broker: LocalKafka, user: str, topic: str) -> bool:
    """Whether `user` is refused a write to `topic`."""
    producer = Producer({**broker.client_config(user), "message.timeout.ms": 10000})
    errors: list[str] = []
    producer.produce(topic, b"x", b"k", on_delivery=lambda err, _: errors.append(str(err)))
    producer.flush(20)
    return any("AUTHORIZATION" in e.upper() for e in errors)


def test_each_component_runs_with_the_readme_acls_and_nothing_more(
    broker: LocalKafka, tmp_path: Path
) -> None:
    admin = broker.client_config()
    created = splitbrain("topics", "apply", "--profile", "local", env=connection_env(admin))
    assert created.returncode == 0, created.stdout + created.stderr
    grant_as_the_docs_say(broker, tmp_path)

    topics = WorkerTopics(INPUT_TOPIC, FINDINGS_TOPIC, DLQ_TOPIC, WORKER)
    hook = Receiver()
    bridge_log = (tmp_path / "page.log").open("wb")
    bridge = subprocess.Popen(
        [sys.executable, "-m", "detector.cli", "page", "--webhook-url", hook.url],
        env=connection_env(broker.client_config(PAGER)),
        stdout=bridge_log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        with WorkerProcess(broker.client_config(WORKER), topics, tmp_path / "workers") as worker:
            agents = connection_env(broker.client_config(AGENTS))
            example = subprocess.run(
                [sys.executable, "-c", doc_block(EMITTER, EMIT_HEADING, "python")],
                env=agents,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert example.returncode == 0, f"the documented emit example:\n{example.stderr}"
            replayed = splitbrain("replay", str(SEED_FIXTURE), env=agents)
            assert replayed.returncode == 0, replayed.stdout + replayed.stderr

            def critical() -> bool:
                found = latest(read_committed(admin, FINDINGS_TOPIC, timeout=5))
                return any(
                    f["workflow_key"] == "export-ledger" and f["severity"] == "critical"
                    for f in found.values()
                )

            wait_for(critical, "the worker's critical finding", workers=[worker])

            def paged() -> bool:
                return any(
                    d.get("workflow_key") == "export-ledger" and d.get("severity") == "critical"
                    for d in hook.documents()
                )

            deadline = time.monotonic() + 90
            while not paged():
                assert bridge.poll() is None, (tmp_path / "page.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "page.log").read_text()[-3000:]
                time.sleep(0.2)
            assert "uthoriz" not in worker.log.read_text(), worker.tail()
    finally:
        bridge.send_signal(signal.SIGTERM)
        bridge.wait(60)
        bridge_log.close()
        hook.close()
    # What was not granted is refused: the agents write only the input, the bridge nothing of it.
    try:
        assert refused(broker, AGENTS, FINDINGS_TOPIC)
        assert refused(broker, PAGER, INPUT_TOPIC)
    except KafkaException as exc:  # a refusal may also surface as an exception
        assert "AUTHORIZ" in str(exc).upper(), exc
