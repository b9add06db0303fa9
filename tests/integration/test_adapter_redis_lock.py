"""The Redis lock adapter against Debian's `redis-server`, a real broker and the detector worker:
a holder paused past its lock's timeout writes after another took the lock, and the findings
topic says so, critical, exactly as `audit` finds it in the same events.

The holders run in the test, each in a thread of its own, through `FencedLock` and the shared
sink, as a service's code would; A's pause is its thread blocked past the lock's timeout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from confluent_kafka import IsolationLevel

from detector.adapters import AdapterSink, effect_committed
from detector.devstack.redis import LocalRedis
from detector.devstack.topics import TopicReader
from detector.kafka.emit import Emitter
from tests.integration.deployment import Deployment, audited
from tests.integration.test_worker import wait_for_audit
from tests.tools import program

pytest.importorskip("redis", reason="the redis-lock extra is not installed (.[redis-lock])")

import redis
from redis.exceptions import LockNotOwnedError

from detector.adapters.redis_lock import FencedLock, fenced_lock_class
from tests.unit.test_adapter_redis_lock import NAME, Holder


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    program("redis-server", package="redis-server")
    with LocalRedis() as server:
        yield server


def test_a_paused_lock_holder_writing_after_the_takeover_is_the_critical_finding_audit_gives(
    kafka_deployment: Deployment, redis_server: LocalRedis
) -> None:
    d = kafka_deployment
    worker = d.worker()
    sink = AdapterSink("redis-lock", publisher=lambda: Emitter(d.config, topic=d.topics.input))
    client = redis.Redis.from_url(redis_server.url)
    refused: list[bool] = []

    def wakes_and_writes(lock: FencedLock) -> None:
        # A goes on as if it still held the lock: an email (its own word), then the ledger,
        # which refuses its fence; only its extend tells it that it lost the lock.
        assert effect_committed("email/42", destination="smtp")
        refused.append(not lock.fenced_set("ledger/42", "paid by A", effect_key="charge/42"))
        with pytest.raises(LockNotOwnedError):
            lock.extend(1)

    try:
        a = Holder(client, fenced_lock_class(sink, worker_id="worker-a"), wakes_and_writes)
        b = client.lock(NAME, timeout=30, lock_class=fenced_lock_class(sink, worker_id="worker-b"))
        assert b.acquire(blocking_timeout=30)  # once A's key expired
        assert b.fence == 2
        assert b.fenced_set("ledger/42", "paid by B", effect_key="charge/42")
        a.resume()
        assert not a.errors, a.errors
        assert refused == [True]
        b.release()
        assert sink.flush(30)

        with TopicReader(
            d.config, d.topics.input, isolation=IsolationLevel.READ_UNCOMMITTED
        ) as events:
            lines = [r.value for r in events.read_to_end()]
        expected = audited(lines)
        with d.reader(d.topics.findings) as findings:
            wait_for_audit(findings, expected, [worker])
    finally:
        sink.close()
        client.close()

    (finding,) = expected.values()
    assert finding["workflow_key"] == NAME
    assert finding["severity"] == "critical"
    assert finding["displaced"] == {"worker_id": "worker-a", "owner_epoch": 1}
    assert finding["current"] == {"worker_id": "worker-b", "owner_epoch": 2}
    by_key = {c["effect_key"]: c["kind"] for c in finding["conditions"]}
    # The email landed; the ledger's refusal is its receipt, never a commit.
    assert by_key == {
        "email/42": "stale_effect_committed",
        "charge/42": "stale_effect_rejected",
    }, json.dumps(finding)
    assert finding["ordering"] == "arrival"  # no seq: Redis gives the holder no order to read
    context = finding["context"]
    assert context["displaced"]["lock"] == NAME
    assert context["displaced"]["timeout_s"] == "1.0"
    assert context["current"]["epoch_authority"] == "approximate"
