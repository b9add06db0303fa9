"""The Celery adapter around a task run in this process (`apply`): the events of one delivery,
the task's effect calls carrying its key and epoch, the epoch's source and authority said in
attrs, `ownership_uncertain` once an `acks_late` task outlives the visibility timeout, and a task
that never sees a failure of ours."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detector.adapters import AdapterSink, Authority, effect_committed
from detector.contracts.events import Kind, OwnershipEvent, Source
from tests.unit.test_adapter_sink import Recorder

pytest.importorskip("celery", reason="the celery extra is not installed (.[celery])")

from celery import Celery, signals

from detector.adapters.celery import CeleryAdapter, Watchdog, broker_epoch, install
from detector.histories.audit import audit_lines
from detector.report import context_sides

Run = Callable[..., list[OwnershipEvent]]


def make_app(**transport: Any) -> Celery:
    app = Celery("test-adapter", broker="memory://")
    app.conf.update(task_acks_late=True, broker_transport_options=transport)
    return app


def as_task(app: Celery, fn: Callable[..., Any]) -> Any:
    """`fn` as a task of `app`, named as the function."""
    return app.task(name=fn.__name__)(fn)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def sink(recorder: Recorder) -> Iterator[AdapterSink]:
    sink = AdapterSink("celery", publisher=lambda: recorder, registry=CollectorRegistry())
    yield sink
    sink.close()


@pytest.fixture
def installed() -> Iterator[list[CeleryAdapter]]:
    adapters: list[CeleryAdapter] = []
    yield adapters
    for adapter in adapters:
        adapter.uninstall()


def events_of(sink: AdapterSink, recorder: Recorder) -> list[OwnershipEvent]:
    assert sink.flush(10)
    return recorder.events


def test_one_delivery_reports_acquired_effect_released(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    app = make_app()
    installed.append(install(app, sink=sink, worker_id="w1"))

    def send(address: str) -> None:
        assert effect_committed(f"email:{address}", destination="smtp")

    as_task(app, send).apply(args=["a@example.com"], task_id="t-1")
    acquired, committed, released = events_of(sink, recorder)
    assert [e.kind for e in (acquired, committed, released)] == [
        Kind.LEASE_ACQUIRED,
        Kind.EFFECT_COMMITTED,
        Kind.LEASE_RELEASED,
    ]
    for event in (acquired, committed, released):
        assert (event.workflow_key, event.owner_epoch, event.worker_id) == ("t-1", 1, "w1")
        assert event.attrs == {
            "task_name": "send",
            "epoch_authority": Authority.MINTED.value,
            "epoch_from": "celery.redelivered",  # no Redis: the weakest epoch, and it says so
        }
    # A minted epoch claims no coordinator's authority (DESIGN §4).
    assert acquired.source is Source.WORKER
    assert committed.effect_key == "email:a@example.com"
    assert released.detail == {"state": "SUCCESS", "redelivered": False}
    # Celery's words (DESIGN §5 `context`): a first delivery, no retry; the task's name in attrs.
    assert acquired.detail == committed.detail == {"redelivered": False}


def test_a_failing_task_is_released_with_its_state_and_the_context_ends(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    app = make_app()
    installed.append(install(app, sink=sink))

    def boom() -> None:
        raise ValueError("no")

    result = as_task(app, boom).apply(task_id="t-2")
    assert isinstance(result.result, ValueError)
    assert not effect_committed("after:the-task")  # outside any task: no owner to name
    kinds = [(e.kind, e.detail) for e in events_of(sink, recorder)]
    assert kinds == [
        (Kind.LEASE_ACQUIRED, {"redelivered": False}),
        (Kind.LEASE_RELEASED, {"redelivered": False, "state": "FAILURE"}),
    ]


def test_an_acks_late_task_past_the_visibility_timeout_is_uncertain(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    app = make_app(visibility_timeout=0.2)
    installed.append(install(app, sink=sink))
    during = threading.Event()

    def slow() -> None:
        deadline = time.monotonic() + 10
        while not any(e.kind is Kind.OWNERSHIP_UNCERTAIN for e in events_of(sink, recorder)):
            assert time.monotonic() < deadline, "no ownership_uncertain while the task ran"
            time.sleep(0.02)
        during.set()

    def quick() -> None:
        pass

    as_task(app, slow).apply(task_id="t-slow")
    assert during.is_set()
    as_task(app, quick).apply(task_id="t-quick")
    events = events_of(sink, recorder)
    uncertain = [e for e in events if e.kind is Kind.OWNERSHIP_UNCERTAIN]
    assert [(e.workflow_key, e.owner_epoch) for e in uncertain] == [("t-slow", 1)]
    assert uncertain[0].detail == {
        "reason": "visibility_timeout",
        "visibility_timeout_s": 0.2,
        "redelivered": False,
        "outlived": "visibility_timeout",  # by the worker's clock: later events say it too
    }
    acquired = next(e for e in events if e.kind is Kind.LEASE_ACQUIRED)
    assert acquired.lease_duration_s == 0.2


def test_a_task_without_acks_late_has_no_timer(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    app = make_app(visibility_timeout=0.01)
    app.conf.task_acks_late = False
    installed.append(install(app, sink=sink))

    def early() -> None:
        time.sleep(0.1)

    as_task(app, early).apply(task_id="t-early")
    events = events_of(sink, recorder)
    assert [e.kind for e in events] == [Kind.LEASE_ACQUIRED, Kind.LEASE_RELEASED]
    assert events[0].lease_duration_s is None


def test_the_task_never_sees_our_failures(installed: list[CeleryAdapter]) -> None:
    """Kafka refusing every event and Redis unreachable: the task runs and returns as before."""

    def broken() -> Recorder:
        raise RuntimeError("no broker")

    registry = CollectorRegistry()
    sink = AdapterSink("celery", publisher=broken, registry=registry)
    app = make_app()
    installed.append(install(app, sink=sink, epoch_redis_url="redis://127.0.0.1:1/0"))

    def add(a: int, b: int) -> int:
        effect_committed("sum")
        return a + b

    assert as_task(app, add).apply(args=[2, 3], task_id="t-3").get() == 5
    sink.close(1)
    dropped = [
        registry.get_sample_value(
            "splitbrain_adapter_events_dropped_total", {"adapter": "celery", "reason": reason}
        )
        for reason in ("kafka", "closed")
    ]
    assert sum(n or 0 for n in dropped) == 3  # acquired, committed, released: counted, not raised


def test_the_broker_delivery_count_is_the_epoch_where_it_has_one() -> None:
    sqs = SimpleNamespace(
        delivery_info={"sqs_message": {"Attributes": {"ApproximateReceiveCount": "3"}}},
        headers={},
    )
    epoch = broker_epoch(sqs, quorum=False)
    assert epoch is not None
    assert (epoch.value, epoch.authority, epoch.source) == (
        3,
        Authority.APPROXIMATE,
        "sqs.approximate_receive_count",
    )
    first = SimpleNamespace(delivery_info={}, headers={})
    again = SimpleNamespace(delivery_info={}, headers={"x-delivery-count": 2})
    values = [getattr(broker_epoch(m, quorum=True), "value", None) for m in (first, again)]
    assert values == [1, 3]  # absent on a first delivery; counts the earlier ones
    assert broker_epoch(first, quorum=False) is None  # Redis, classic queues: minted instead


def test_the_timer_fires_only_what_is_still_armed_and_forgets_what_ended() -> None:
    watchdog = Watchdog()
    fired: list[str] = []
    for _ in range(1000):  # tasks that ended long before their visibility timeout
        watchdog.disarm(watchdog.arm(time.monotonic() + 3600, lambda: fired.append("ended")))
    late = watchdog.arm(time.monotonic() + 0.05, lambda: fired.append("late"))
    cancelled = watchdog.arm(time.monotonic() + 0.05, lambda: fired.append("cancelled"))
    watchdog.disarm(cancelled)
    deadline = time.monotonic() + 10
    while fired != ["late"]:
        assert time.monotonic() < deadline, fired
        time.sleep(0.01)
    watchdog.disarm(late)  # after it fired: nothing
    assert len(watchdog._heap) <= 2  # the ended tasks' timers were not kept for an hour


def test_a_pool_child_s_shutdown_sends_what_its_sink_holds(
    recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    """A prefork child ends with `os._exit` (no `atexit`): Celery's `worker_process_shutdown`,
    sent in the child just before, flushes the sink as the exit would, and closes it."""
    registry = CollectorRegistry()
    sink = AdapterSink("celery", publisher=lambda: recorder, registry=registry)
    app = make_app()
    installed.append(install(app, sink=sink, worker_id="w1"))

    def noop() -> None:
        pass

    task = as_task(app, noop)
    task.apply(task_id="t-1")
    signals.worker_process_shutdown.send(sender=None, pid=1, exitcode=0)
    assert [e.kind for e in recorder.events] == [Kind.LEASE_ACQUIRED, Kind.LEASE_RELEASED]
    task.apply(task_id="t-2")  # after it: counted, never queued
    assert sink.queued == 0
    assert (
        registry.get_sample_value(
            "splitbrain_adapter_events_dropped_total", {"adapter": "celery", "reason": "exit"}
        )
        == 2
    )


# ---- the source's words, through the worker's own path (receipt in the main process, then the
# task's run in the pool's child, with the headers the receipt added) ---------------------------


class Worker:
    """One worker of `app` (its own adapter), delivering messages as Celery's consumer and pool
    do: `task_received` with the broker's message, then `task_prerun` … `task_postrun` around the
    task's body, with the request the receipt's headers went into."""

    def __init__(self, app: Celery, adapter: CeleryAdapter, hostname: str) -> None:
        self.app = app
        self.adapter = adapter
        self.hostname = hostname

    @contextmanager
    def delivery(
        self,
        name: str,
        task_id: str,
        *,
        redelivered: bool = False,
        retries: int = 0,
        receive_count: int | None = None,
    ) -> Iterator[None]:
        task = self.app.tasks[name]
        info: dict[str, Any] = {"redelivered": redelivered}
        if receive_count is not None:  # SQS: its count, and no flag
            info = {"sqs_message": {"Attributes": {"ApproximateReceiveCount": str(receive_count)}}}
        request = SimpleNamespace(
            task=task,
            message=SimpleNamespace(delivery_info=info, headers={}),
            id=task_id,
            name=name,
            hostname=self.hostname,
            delivery_info=info,
            request_dict={"retries": retries},
        )
        signals.task_received.send(sender=None, request=request)
        task.push_request(
            id=task_id,
            hostname=self.hostname,
            delivery_info=info,
            acks_late=True,
            **request.request_dict,  # the retries, and the headers the receipt added
        )
        signals.task_prerun.send(sender=task, task_id=task_id, task=task, args=(), kwargs={})
        try:
            yield
        finally:
            signals.task_postrun.send(
                sender=task, task_id=task_id, task=task, state="SUCCESS", args=(), kwargs={}
            )
            task.pop_request()


def add(a: int, b: int) -> int:
    return a + b


def two_workers(sink: AdapterSink, installed: list[CeleryAdapter]) -> tuple[Worker, Worker]:
    workers = []
    for host in ("celery@w1", "celery@w2"):
        app = make_app(visibility_timeout=0.2)
        app.task(name="myapp.add")(add)
        adapter = install(app, sink=sink)
        installed.append(adapter)
        workers.append(Worker(app, adapter, host))
    return workers[0], workers[1]


def test_a_redelivery_says_so_and_its_effects_name_the_task(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    w1, _ = two_workers(sink, installed)
    with w1.delivery("myapp.add", "t-9", redelivered=True, retries=2):
        assert effect_committed("sum/t-9")
    acquired, committed, released = events_of(sink, recorder)
    for event in (acquired, committed, released):
        assert event.attrs is not None and event.attrs["task_name"] == "myapp.add"
        assert event.detail is not None
        assert (
            event.detail.items()
            >= {
                "redelivered": True,  # kombu's delivery_info, read at receipt, in the child
                "retries": 2,
                "visibility_timeout_s": 0.2,
            }.items()
        )
    assert (acquired.owner_epoch, acquired.worker_id) == (2, "celery@w1")


def test_a_finding_names_the_task_and_says_it_outlived_its_visibility_timeout(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    """The issue's case, end to end: `myapp.add` on w1 outlives the visibility timeout, the
    broker redelivers it to w2, and both send the email. The adapters' events, through `audit`,
    make a finding in Celery's words."""
    w1, w2 = two_workers(sink, installed)
    with w1.delivery("myapp.add", "t-1"):
        deadline = time.monotonic() + 10
        while not any(e.kind is Kind.OWNERSHIP_UNCERTAIN for e in events_of(sink, recorder)):
            assert time.monotonic() < deadline, "no ownership_uncertain"
            time.sleep(0.02)
        with w2.delivery("myapp.add", "t-1", redelivered=True):
            assert effect_committed("email/a@example.com")
        assert effect_committed("email/a@example.com")  # the zombie
    lines = [e.model_dump_json(exclude_none=True).encode() for e in events_of(sink, recorder)]
    (finding,) = audit_lines(lines).findings.values()
    assert finding.displaced is not None and finding.current is not None
    assert (finding.displaced.worker_id, finding.current.worker_id) == ("celery@w1", "celery@w2")
    ctx = finding.context
    assert ctx is not None and ctx.displaced and ctx.current and ctx.latest_condition
    for side in (ctx.displaced, ctx.latest_condition, ctx.current):
        assert side["task_name"] == "myapp.add"
        assert side["visibility_timeout_s"] == "0.2"
    assert ctx.displaced["redelivered"] == ctx.latest_condition["redelivered"] == "false"
    assert ctx.latest_condition["outlived"] == "visibility_timeout"
    assert ctx.current["redelivered"] == "true"
    text = "\n".join(f"{label}: {words}" for label, words in context_sides(finding))
    assert "task_name=myapp.add" in text and "outlived=visibility_timeout" in text


def test_a_broker_s_receive_count_says_redelivered_where_it_sets_no_flag(
    sink: AdapterSink, recorder: Recorder, installed: list[CeleryAdapter]
) -> None:
    w1, _ = two_workers(sink, installed)
    with w1.delivery("myapp.add", "t-sqs-1", receive_count=1):
        pass
    with w1.delivery("myapp.add", "t-sqs-2", receive_count=3):
        pass
    acquired = [e for e in events_of(sink, recorder) if e.kind is Kind.LEASE_ACQUIRED]
    assert [(e.owner_epoch, (e.detail or {}).get("redelivered")) for e in acquired] == [
        (1, False),
        (3, True),
    ]
