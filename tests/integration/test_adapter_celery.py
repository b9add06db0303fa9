"""The Celery adapter against Debian's `redis-server`, two real Celery workers (prefork), a real
broker and the detector worker.

The zombie of ADAPTERS.md: an `acks_late` task works past the 3 s visibility timeout; the Redis
transport restores the unacknowledged message and the other worker gets it, redelivered, and
sends the email; the first worker then sends it too. Celery reports nothing; the findings topic
says critical, exactly as `audit` finds it in the same events.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detector.adapters import AdapterSink
from detector.contracts.events import Kind, OwnershipEvent, parse_event_json
from detector.demos.celery import (
    ADDRESS,
    BROKER_ENV,
    FIRST_ENV,
    READY,
    TOPIC_ENV,
    says,
    worker_argv,
)
from detector.devstack.kafka import LocalKafka
from detector.devstack.redis import LocalRedis
from detector.devstack.topics import read_committed
from tests.integration.conftest import deploy
from tests.integration.deployment import audited, wait_for
from tests.integration.kafka_harness import broker_env
from tests.integration.test_worker import wait_for_audit
from tests.tools import program
from tests.unit.test_adapter_celery import as_task
from tests.unit.test_adapter_sink import Recorder

pytest.importorskip("celery", reason="the celery extra is not installed (.[celery])")

from celery import Celery

from detector.adapters.celery import install
from detector.demos.celery_app import TASK


@pytest.fixture
def redis() -> Iterator[LocalRedis]:
    program("redis-server", package="redis-server")
    with LocalRedis() as server:
        yield server


def start_workers(
    env: dict[str, str], logs: Path, count: int = 2
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """`count` workers of detector.demos.celery_app, each until it consumes."""
    workers = []
    for n in range(1, count + 1):
        log = logs / f"celery-{n}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                worker_argv(n),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        workers.append((proc, log))
    for _, log in workers:
        wait_for(functools.partial(says, log, READY), f"{log.name} to be ready")
    return workers


def stop_workers(workers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """SIGTERM to each worker, then SIGKILL to its process group (the pool's children)."""
    for proc, _ in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc, _ in workers:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def events_of(config: dict[str, Any], topic: str, task_id: str) -> list[OwnershipEvent]:
    records = read_committed(config, topic)
    return [parse_event_json(r.value) for r in records if r.key == task_id.encode()]


def test_a_redelivered_acks_late_task_sending_again_is_the_critical_finding_audit_gives(
    kafka_broker: LocalKafka, redis: LocalRedis, tmp_path: Path
) -> None:
    d = deploy(kafka_broker, tmp_path, "kafka")
    env = broker_env(
        kafka_broker, **{BROKER_ENV: redis.url, TOPIC_ENV: d.topics.input, FIRST_ENV: "6"}
    )
    workers = start_workers(env, tmp_path)
    task_id = str(uuid.uuid4())
    try:
        detector = d.worker()
        client = Celery("test-client", broker=redis.url)
        client.send_task(TASK, args=[ADDRESS], task_id=task_id)
        client.close()

        def events() -> list[OwnershipEvent]:
            return events_of(d.config, d.topics.input, task_id)

        wait_for(
            lambda: sum(e.kind is Kind.LEASE_RELEASED for e in events()) == 2,
            "both deliveries to end",
            workers=[detector],
        )
        history = events()
        lines = [r.value for r in read_committed(d.config, d.topics.input)]
        expected = audited(lines)
        with d.reader(d.topics.findings) as findings:
            wait_for_audit(findings, expected, [detector])
    finally:
        stop_workers(workers)
        d.close()

    # What happened, as the adapter told it: two deliveries, two workers, minted epochs 1 and 2
    # (an INCR per task id in the broker's Redis), the first one past its visibility timeout.
    acquired = [e for e in history if e.kind is Kind.LEASE_ACQUIRED]
    assert [e.owner_epoch for e in acquired] == [1, 2]
    assert len({e.worker_id for e in acquired}) == 2
    for e in history:
        assert e.attrs == {
            "epoch_from": "redis.incr",
            "epoch_authority": "minted",
            "task_name": TASK,
        }
    # Celery's words (DESIGN §5 `context`): the redelivery says so, as Redis's restore marked it;
    # the first delivery's effect after its visibility timeout says it outlived it.
    assert [(e.detail or {}).get("redelivered") for e in acquired] == [False, True]
    assert {(e.detail or {}).get("visibility_timeout_s") for e in history} == {3.0}
    uncertain = [e.owner_epoch for e in history if e.kind is Kind.OWNERSHIP_UNCERTAIN]
    assert uncertain == [1]
    committed = [e for e in history if e.kind is Kind.EFFECT_COMMITTED]
    assert [(e.owner_epoch, e.effect_key) for e in committed] == [
        (2, f"email:{ADDRESS}"),
        (1, f"email:{ADDRESS}"),
    ]
    # The critical finding the worker published (equal to audit's, above).
    (finding,) = expected.values()
    assert finding["workflow_key"] == task_id
    assert finding["severity"] == "critical"
    assert finding["displaced"]["owner_epoch"] == 1
    assert finding["current"]["owner_epoch"] == 2
    conditions = {c["kind"]: c for c in finding["conditions"]}
    assert "stale_effect_committed" in conditions, json.dumps(finding)
    assert conditions["duplicate_effect"]["cause"] == "failover", json.dumps(finding)
    context = finding["context"]
    assert context["latest_condition"]["task_name"] == TASK
    assert context["latest_condition"]["outlived"] == "visibility_timeout"
    assert context["current"]["redelivered"] == "true"


def noop() -> None:
    pass


def test_the_minted_epoch_grows_per_task_id_on_redis(redis: LocalRedis) -> None:
    """Outside a worker (`apply`) the epoch is minted at the task's start."""
    recorder = Recorder()
    sink = AdapterSink("celery", publisher=lambda: recorder, registry=CollectorRegistry())
    app = Celery("test-minted", broker="memory://")
    adapter = install(app, sink=sink, epoch_redis_url=redis.url)
    try:
        task = as_task(app, noop)
        for task_id, retries in (("t", 0), ("t", 1), ("u", 1), ("t", 2), ("u", 0)):
            task.apply(task_id=task_id, retries=retries)
        assert sink.flush(10)
    finally:
        adapter.uninstall()
        sink.close()
    acquired = [
        (e.workflow_key, e.owner_epoch, (e.attrs or {}).get("epoch_from"))
        for e in recorder.events
        if e.kind is Kind.LEASE_ACQUIRED
    ]
    # A first delivery is 1 without a round trip; each later one (a retry here, a redelivery
    # in a worker) takes the next INCR of its task id.
    assert acquired == [
        ("t", 1, "redis.incr"),
        ("t", 2, "redis.incr"),
        ("u", 2, "redis.incr"),
        ("t", 3, "redis.incr"),
        ("u", 1, "redis.incr"),
    ]


def test_a_task_terminated_under_its_worker_is_released_by_the_main_process(
    kafka_broker: LocalKafka, redis: LocalRedis, tmp_path: Path
) -> None:
    """The pool's child is killed (SIGKILL) inside the task: it never reaches postrun, so the
    worker's main process reports the release (the killed delivery acts no more)."""
    d = deploy(kafka_broker, tmp_path, "kafka")
    env = broker_env(
        kafka_broker, **{BROKER_ENV: redis.url, TOPIC_ENV: d.topics.input, FIRST_ENV: "120"}
    )
    workers = start_workers(env, tmp_path, count=1)
    task_id = str(uuid.uuid4())
    client = Celery("test-client", broker=redis.url)
    try:
        client.send_task(TASK, args=[ADDRESS], task_id=task_id)

        def seen(kind: Kind) -> bool:
            return any(e.kind is kind for e in events_of(d.config, d.topics.input, task_id))

        wait_for(functools.partial(seen, Kind.LEASE_ACQUIRED), "the task to start")
        client.control.revoke(task_id, terminate=True, signal="SIGKILL")  # as the OOM killer
        wait_for(functools.partial(seen, Kind.LEASE_RELEASED), "the release")
        history = events_of(d.config, d.topics.input, task_id)
    finally:
        client.close()
        stop_workers(workers)
        d.close()
    # (An ownership_uncertain may come between: the task outlived its 3 s visibility timeout.)
    acquired = next(e for e in history if e.kind is Kind.LEASE_ACQUIRED)
    (released,) = [e for e in history if e.kind is Kind.LEASE_RELEASED]
    assert released.detail == {"state": "ended", "reason": "revoked"}  # the main process's
    assert (released.owner_epoch, released.worker_id) == (acquired.owner_epoch, acquired.worker_id)
    assert released.attrs == acquired.attrs  # task_name, and where the epoch came from
