"""`FencedLock` and `AsyncFencedLock` against Debian's `redis-server` (never a fake: the fence is
the server's INCR inside the acquisition's script): the fence each holder gets, the events of
its life, the zombie of ADAPTERS.md (a holder paused past its timeout writes after another took
the lock) as `audit` finds it, and a stale fence refused by a fenced destination. The broker and
the detector worker are in tests/integration/test_adapter_redis_lock.py."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("redis", reason="the redis-lock extra is not installed (.[redis-lock])")

import redis
import redis.asyncio
from redis.exceptions import LockNotOwnedError

from detector.adapters import AdapterSink, current, effect_committed
from detector.adapters.redis_lock import (
    EPOCH_FROM,
    FencedLock,
    async_fenced_lock_class,
    fenced_lock_class,
)
from detector.contracts.events import Kind, OwnershipEvent, Source
from detector.devstack.redis import LocalRedis
from detector.histories.audit import audit_lines
from tests.tools import program
from tests.unit.test_adapter_sink import Recorder

NAME = "payments"


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    program("redis-server", package="redis-server")
    with LocalRedis() as server:
        yield server


@pytest.fixture
def client(redis_server: LocalRedis) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server.url)
    yield c
    c.close()


class Recorded:
    """A sink publishing to a `Recorder`, and the lock class of each worker reporting to it."""

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.recorder = recorder or Recorder()
        self.sink = AdapterSink(
            "redis-lock", publisher=lambda: self.recorder, registry=CollectorRegistry()
        )

    def lock_class(self, worker: str) -> type[FencedLock]:
        return fenced_lock_class(self.sink, worker_id=worker)

    def events(self) -> list[OwnershipEvent]:
        assert self.sink.flush(10)
        return self.recorder.events


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    r = Recorded()
    yield r
    r.sink.close()


def lines(events: list[OwnershipEvent]) -> list[bytes]:
    return [e.model_dump_json(exclude_none=True).encode() for e in events]


def findings(events: list[OwnershipEvent]) -> list[dict[str, Any]]:
    result = audit_lines(iter(lines(events)))
    return [json.loads(f.to_json()) for f in result.findings.values()]


def test_each_acquisition_mints_the_next_fence_and_its_life_is_reported(
    client: redis.Redis, recorded: Recorded
) -> None:
    lock = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w1"))
    assert lock.fence is None
    with lock:
        assert lock.fence == 1
        assert client.get(f"{NAME}:fence") == b"1"
        assert lock.extend(5)
        assert lock.reacquire()
        assert lock.owned()
        owner = current()
        assert owner is not None and (owner.workflow_key, owner.owner_epoch) == (NAME, 1)
        assert effect_committed("charge/42", destination="psp")
    assert lock.fence is None and current() is None
    assert not effect_committed("charge/43")  # outside the lock: no owner to name
    again = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w2"))
    assert again.acquire(blocking=False)
    assert again.fence == 2
    again.release()

    events = recorded.events()
    assert [(e.kind, e.owner_epoch, e.worker_id) for e in events] == [
        (Kind.LEASE_ACQUIRED, 1, "w1"),
        (Kind.HEARTBEAT, 1, "w1"),
        (Kind.HEARTBEAT, 1, "w1"),
        (Kind.EFFECT_COMMITTED, 1, "w1"),
        (Kind.LEASE_RELEASED, 1, "w1"),
        (Kind.LEASE_ACQUIRED, 2, "w2"),
        (Kind.LEASE_RELEASED, 2, "w2"),
    ]
    first = events[0]
    # The fence is Redis's, but resettable and never fenced on by Redis: approximate, so the
    # acquisition is the worker's word; the timeout is the lease's duration.
    assert first.source is Source.WORKER
    assert first.attrs == {"epoch_authority": "approximate", "epoch_from": EPOCH_FROM}
    assert first.lease_duration_s == 30.0
    assert first.seq is None
    for e in events:  # the lock's words (DESIGN §5 `context`): its name and its timeout
        assert e.workflow_key == NAME
        assert (e.detail or {}).items() >= {"lock": NAME, "timeout_s": 30.0}.items()


def test_a_lock_without_a_timeout_is_fenced_too(client: redis.Redis, recorded: Recorded) -> None:
    lock = client.lock(NAME, lock_class=recorded.lock_class("w1"))
    with lock:
        assert lock.fence == 1
        assert client.pttl(NAME) == -1  # SET NX without PX, as redis-py's own Lock does
    (acquired, released) = recorded.events()
    assert acquired.kind is Kind.LEASE_ACQUIRED and acquired.lease_duration_s is None
    assert "timeout_s" not in (acquired.detail or {})
    assert released.kind is Kind.LEASE_RELEASED


def test_a_held_lock_is_not_taken_and_mints_nothing(
    client: redis.Redis, recorded: Recorded
) -> None:
    holder = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w1"))
    assert holder.acquire()
    other = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w2"))
    assert not other.acquire(blocking=False)
    assert other.fence is None
    assert client.get(f"{NAME}:fence") == b"1"  # the INCR only follows a successful SET NX
    holder.release()
    assert [e.kind for e in recorded.events()] == [Kind.LEASE_ACQUIRED, Kind.LEASE_RELEASED]


def test_a_server_that_forgot_the_scripts_is_given_them_again(
    client: redis.Redis, redis_server: LocalRedis, recorded: Recorded
) -> None:
    lock = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w1"))
    with lock:
        assert lock.fence == 1
    client.script_flush()  # as a restarted or switched server would have (NOSCRIPT)
    with lock:
        assert lock.fence == 2
        assert lock.fenced_set("ledger/42", "paid", effect_key="charge/42")

    async def run() -> None:
        async with redis.asyncio.Redis.from_url(redis_server.url) as c:
            await c.script_flush()
            held = async_fenced_lock_class(recorded.sink, worker_id="w2")(c, NAME, timeout=30)
            assert await held.acquire()
            assert held.fence == 3
            await held.release()

    asyncio.run(run())
    events = recorded.events()
    assert [e.owner_epoch for e in events if e.kind is Kind.LEASE_ACQUIRED] == [1, 2, 3]
    assert [e.owner_epoch for e in events if e.kind is Kind.LEASE_RELEASED] == [1, 2, 3]
    assert [e.owner_epoch for e in events if e.kind is Kind.EFFECT_COMMITTED] == [2]


def test_a_lock_renamed_or_given_another_timeout_is_fenced_under_its_new_name(
    client: redis.Redis, recorded: Recorded
) -> None:
    lock = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w1"))
    with lock:
        assert lock.fence_key == f"{NAME}:fence"
    lock.name, lock.timeout = "refunds", 5  # redis-py reads both at each call
    with lock:
        assert lock.fence == 1 and lock.fence_key == "refunds:fence"
        assert 0 < client.pttl("refunds") <= 5000
    acquired = recorded.events()[2]
    assert (acquired.workflow_key, acquired.lease_duration_s) == ("refunds", 5.0)
    assert (acquired.detail or {}).items() >= {"lock": "refunds", "timeout_s": 5.0}.items()


class Holder:
    """A lock holder in a thread of its own: acquires, then waits to be woken (a GC pause, a
    stalled VM) and runs `then` as if it still held the lock."""

    def __init__(
        self, client: redis.Redis, lock_class: type[FencedLock], then: Callable[[FencedLock], None]
    ) -> None:
        self.lock: FencedLock = client.lock(NAME, timeout=1, lock_class=lock_class)
        self.acquired = threading.Event()
        self.wake = threading.Event()
        self.errors: list[BaseException] = []
        self._then = then
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.acquired.wait(20), "the holder did not acquire"

    def _run(self) -> None:
        try:
            assert self.lock.acquire()
            self.acquired.set()
            self.wake.wait(60)
            self._then(self.lock)
        except BaseException as exc:
            self.errors.append(exc)

    def resume(self) -> None:
        self.wake.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def take_over(client: redis.Redis, recorded: Recorded) -> FencedLock:
    """B waits for A's key to expire and takes the lock."""
    b: FencedLock = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("worker-b"))
    assert b.acquire(blocking_timeout=30)
    return b


def test_a_holder_paused_past_its_timeout_writing_after_the_takeover_is_a_stale_commit(
    client: redis.Redis, recorded: Recorded
) -> None:
    def wakes_and_charges(lock: FencedLock) -> None:
        # It goes on as if it held the lock (redis-py's Lock says nothing until asked).
        assert effect_committed("charge/42", destination="psp")
        with pytest.raises(LockNotOwnedError):
            lock.extend(1)

    a = Holder(client, recorded.lock_class("worker-a"), wakes_and_charges)
    assert a.lock.fence is None  # the fence is the acquiring thread's
    b = take_over(client, recorded)
    assert b.fence == 2
    assert effect_committed("batch/7", destination="psp")  # B's own work
    a.resume()
    assert not a.errors, a.errors
    b.release()

    events = recorded.events()
    assert [(e.kind, e.owner_epoch) for e in events] == [
        (Kind.LEASE_ACQUIRED, 1),
        (Kind.LEASE_ACQUIRED, 2),
        (Kind.EFFECT_COMMITTED, 2),
        (Kind.EFFECT_COMMITTED, 1),
        (Kind.LEASE_LOST, 1),
        (Kind.LEASE_RELEASED, 2),
    ]
    assert (events[4].detail or {})["call"] == "extend"
    (finding,) = findings(events)
    assert finding["severity"] == "critical"
    assert finding["displaced"] == {"worker_id": "worker-a", "owner_epoch": 1}
    assert finding["current"] == {"worker_id": "worker-b", "owner_epoch": 2}
    assert [c["kind"] for c in finding["conditions"]] == ["stale_effect_committed"]
    assert finding["effect_keys"] == ["charge/42"]
    # No seq: ordered by arrival, and a worker's own word: the lowest confidence.
    assert finding["ordering"] == "arrival"
    assert finding["confidence"] == "low"
    assert finding["context"]["displaced"]["lock"] == NAME


def test_a_stale_fence_refused_by_a_fenced_destination_is_rejected_not_committed(
    client: redis.Redis, recorded: Recorded
) -> None:
    refused: list[bool] = []

    def wakes_and_writes(lock: FencedLock) -> None:
        refused.append(not lock.fenced_set("ledger/42", "paid by A", effect_key="charge/42"))

    a = Holder(client, recorded.lock_class("worker-a"), wakes_and_writes)
    b = take_over(client, recorded)
    assert b.fenced_set("ledger/42", "paid by B", effect_key="charge/42")
    a.resume()
    assert not a.errors, a.errors
    assert refused == [True]
    assert client.get("ledger/42") == b"paid by B"  # the destination kept B's write
    b.release()

    events = recorded.events()
    receipts = [e for e in events if e.effect_key == "charge/42"]
    assert [(e.kind, e.owner_epoch, e.source) for e in receipts] == [
        (Kind.EFFECT_COMMITTED, 2, Source.DESTINATION),
        (Kind.EFFECT_REJECTED, 1, Source.DESTINATION),
    ]
    assert [(e.detail or {}).get("fence") for e in receipts] == [2, 1]
    (finding,) = findings(events)
    kinds = [c["kind"] for c in finding["conditions"]]
    assert kinds == ["stale_effect_rejected"], kinds
    assert finding["severity"] == "warning"
    assert finding["displaced"]["owner_epoch"] == 1
    # The receipt is the destination's: the outcome is a rejection, never a commit.
    assert finding["sink_outcome"] == "rejected"
    assert finding["confidence"] == "medium"  # the destination's word, ordered by arrival


def test_owned_returning_false_is_the_holder_learning_it_lost_the_lock(
    client: redis.Redis, recorded: Recorded
) -> None:
    lock = client.lock(NAME, timeout=30, lock_class=recorded.lock_class("w1"))
    assert lock.acquire()
    client.delete(NAME)  # as an expiry would
    assert not lock.owned()
    assert not lock.owned()  # reported once
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert current() is None
    events = recorded.events()
    assert [e.kind for e in events] == [Kind.LEASE_ACQUIRED, Kind.LEASE_LOST]
    assert (events[1].detail or {})["call"] == "owned"


def test_a_sink_that_cannot_reach_kafka_never_fails_the_holder(client: redis.Redis) -> None:
    def no_kafka() -> Recorder:
        raise RuntimeError("no broker")

    sink = AdapterSink(
        "redis-lock", publisher=no_kafka, registry=CollectorRegistry(), exit_flush_s=0
    )
    try:
        lock = client.lock(NAME, timeout=30, lock_class=fenced_lock_class(sink))
        with lock:
            assert lock.fence == 1
            assert lock.extend(1)
            assert effect_committed("charge/42")
            assert lock.fenced_set("ledger/42", "paid", effect_key="charge/42")
        assert client.get(NAME) is None
    finally:
        sink.close(0.5)


def test_the_asyncio_lock_fences_reports_and_names_its_task_s_effects(
    redis_server: LocalRedis, recorded: Recorded
) -> None:
    lock_class = async_fenced_lock_class(recorded.sink, worker_id="w1")

    async def run() -> None:
        c = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            first = lock_class(c, NAME, timeout=30)  # what c.lock(..., lock_class=) makes
            assert await first.acquire()
            assert first.fence == 1
            assert effect_committed("charge/42")
            assert await first.extend(1)
            await c.delete(NAME)  # as an expiry would
            with pytest.raises(LockNotOwnedError):
                await first.extend(1)
            with pytest.raises(LockNotOwnedError):
                await first.release()
            assert current() is None
            second = lock_class(c, NAME, timeout=30)
            assert await second.acquire(blocking=False)
            assert second.fence == 2
            await second.release()
        finally:
            await c.aclose()

    asyncio.run(run())
    events = recorded.events()
    assert [(e.kind, e.owner_epoch) for e in events] == [
        (Kind.LEASE_ACQUIRED, 1),
        (Kind.EFFECT_COMMITTED, 1),
        (Kind.HEARTBEAT, 1),
        (Kind.LEASE_LOST, 1),
        (Kind.LEASE_ACQUIRED, 2),
        (Kind.LEASE_RELEASED, 2),
    ]
    assert (events[3].detail or {})["call"] == "extend"
