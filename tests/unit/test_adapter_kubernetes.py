"""`LeaseWatcher` fed Lease watch events as the API server sends them: synthetic ones for each
rule, and the stream recorded from a real kube-apiserver v1.35.4 (tests/data/kubernetes/, made
by the slow test in tests/integration/test_adapter_kubernetes.py) replayed through the same code,
whose events must be what the live watcher published and whose zombie `audit` must find."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")

from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord

from detector.adapters import AdapterSink, effect_committed
from detector.adapters._watch import WatchMetrics
from detector.adapters.kubernetes import LeaderElector, LeaseWatcher, _RecordingLeaseLock, feed
from detector.contracts.events import parse_event_obj
from detector.histories.audit import audit_lines
from tests.unit.test_adapter_sink import Recorder

RECORDED = Path(__file__).resolve().parents[1] / "data" / "kubernetes"
KEY = "default/payments-leader"


def lease(
    rv: int,
    holder: str | None,
    *,
    transitions: int | None = None,
    renew: str = "2026-12-02T10:00:00.000000Z",
    uid: str = "u1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": 4, "renewTime": renew}
    if holder is not None:
        spec["holderIdentity"] = holder
    if transitions is not None:
        spec["leaseTransitions"] = transitions
    meta = {"name": "payments-leader", "namespace": "default", "uid": uid}
    return {"metadata": {**meta, "resourceVersion": str(rv)}, "spec": spec}


def modified(obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": "MODIFIED", "object": obj}


def watcher() -> tuple[LeaseWatcher, CollectorRegistry]:
    registry = CollectorRegistry()
    return LeaseWatcher(lambda key: key == KEY, WatchMetrics("kubernetes", registry)), registry


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str, int, int]]:
    for e in events:
        parse_event_obj(e)  # every event is valid input
    return [(e["kind"], e["worker_id"], e["owner_epoch"], e["seq"]) for e in events]


def test_client_go_leases_take_their_epoch_from_the_transitions() -> None:
    w, registry = watcher()
    events = feed(
        w,
        [
            modified(lease(100, "a", transitions=0)),
            modified(lease(101, "a", transitions=0, renew="2026-12-02T10:00:02Z")),
            modified(lease(102, "a", transitions=0, renew="2026-12-02T10:00:02Z")),
            modified(lease(110, "b", transitions=1)),
            modified(lease(120, "d", transitions=3)),  # c came and went unseen
            modified(lease(130, None, transitions=3)),
        ],
    )
    assert summary(events) == [
        ("lease_acquired", "a", 0, 100),
        ("heartbeat", "a", 0, 101),
        ("lease_acquired", "b", 1, 110),
        ("lease_acquired", "d", 3, 120),
        ("lease_released", "d", 3, 130),
    ]
    assert {e["attrs"]["epoch_from"] for e in events} == {"kubernetes.leaseTransitions"}
    assert events[3]["attrs"]["after_gap"] == "skipped_holders"
    assert events[0]["lease_duration_s"] == 4
    assert (
        registry.get_sample_value(
            "splitbrain_watch_gaps_total", {"watcher": "kubernetes", "reason": "skipped_holders"}
        )
        == 1.0
    )


def test_an_acquisition_names_the_lease_its_holder_transitions_and_the_cause() -> None:
    """DESIGN §5 `context`: the Lease's name and namespace, holderIdentity, leaseTransitions,
    and why it moved, read from the Lease before and after (renewTime + leaseDurationSeconds
    passed, or not yet, or nobody held it)."""
    w, _ = watcher()
    events = feed(
        w,
        [
            modified(lease(100, "a", transitions=0, renew="2026-12-02T10:00:00Z")),
            modified(lease(110, "b", transitions=1, renew="2026-12-02T10:00:05Z")),  # a expired
            modified(lease(120, "c", transitions=2, renew="2026-12-02T10:00:06Z")),  # b did not
            modified(lease(130, None, transitions=2, renew="2026-12-02T10:00:06Z")),
            modified(lease(140, "d", transitions=3, renew="2026-12-02T10:00:07Z")),
        ],
    )
    acquired = [e for e in events if e["kind"] == "lease_acquired"]
    said: list[tuple[str, dict[str, object]]] = [
        ("a", {"lease_transitions": 0}),  # first sight: no cause to give
        ("b", {"lease_transitions": 1, "cause": "renew_time_expired"}),
        ("c", {"lease_transitions": 2, "cause": "taken_before_expiry"}),
        ("d", {"lease_transitions": 3, "cause": "released"}),
    ]
    assert [e["detail"] for e in acquired] == [
        {"lease": "payments-leader", "namespace": "default", "holder_identity": h, **more}
        for h, more in said
    ]
    late = {  # a's work, still going after b took the Lease
        "kind": "effect_committed",
        "event_id": "late-a",
        "workflow_key": KEY,
        "owner_epoch": 0,
        "worker_id": "a",
        "effect_key": "report/1",
        "seq": 111,
    }
    lines = [json.dumps(e).encode() for e in (*events[:2], late)]
    (finding,) = audit_lines(lines).findings.values()
    assert finding.context is not None and finding.context.current is not None
    assert finding.context.current["cause"] == "renew_time_expired"
    assert finding.context.current["holder_identity"] == "b"


def test_without_transitions_the_acquiring_writes_resource_version_is_the_epoch() -> None:
    w, _ = watcher()
    events = feed(
        w,
        [
            modified(lease(200, "pod-a")),
            modified(lease(205, "pod-a", renew="2026-12-02T10:00:01Z")),
            modified(lease(230, "pod-b", renew="2026-12-02T10:00:09Z")),
        ],
    )
    assert summary(events) == [
        ("lease_acquired", "pod-a", 200, 200),
        ("heartbeat", "pod-a", 200, 205),
        ("lease_acquired", "pod-b", 230, 230),
    ]
    assert events[0]["attrs"]["epoch_from"] == "kubernetes.resourceVersion"


def test_a_recreated_lease_keeps_its_epochs_growing() -> None:
    w, registry = watcher()
    feed(w, [modified(lease(300, "a", transitions=5))])
    events = feed(w, [{"type": "ADDED", "object": lease(320, "b", transitions=0, uid="u2")}])
    assert summary(events) == [("lease_acquired", "b", 320, 320)]
    assert (
        registry.get_sample_value(
            "splitbrain_watch_gaps_total", {"watcher": "kubernetes", "reason": "recreated"}
        )
        == 1.0
    )


def test_malformed_leases_are_counted_logged_with_their_key_and_the_watch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w, registry = watcher()
    bad_transitions = lease(400, "a")
    bad_transitions["spec"]["leaseTransitions"] = "three"
    with caplog.at_level(logging.WARNING):
        events = feed(
            w,
            [
                modified(bad_transitions),
                modified({"metadata": {"name": "payments-leader"}}),
                {"type": "SURPRISE", "object": {}},
                modified(lease(401, "a")),
            ],
        )
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"kubernetes: unreadable lease: bad_leaseTransitions: lease {KEY!r}" in logged, logged
    assert summary(events) == [("lease_acquired", "a", 401, 401)]
    counted = {
        reason: registry.get_sample_value(
            "splitbrain_watch_events_invalid_total", {"watcher": "kubernetes", "reason": reason}
        )
        for reason in ("bad_leaseTransitions", "no_name", "bad_event_type")
    }
    assert counted == {"bad_leaseTransitions": 1.0, "no_name": 1.0, "bad_event_type": 1.0}


def test_a_410_asks_for_a_relist_that_reports_what_the_watch_missed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w, registry = watcher()
    feed(w, [modified(lease(500, "a", transitions=1))])
    with caplog.at_level(logging.WARNING):
        assert feed(w, [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]) == []
    assert "watch expired at resourceVersion 500 (410): relisting" in caplog.text
    assert w.gone
    listing = {"metadata": {"resourceVersion": "560"}, "items": [lease(550, "c", transitions=3)]}
    events = feed(w, [{"type": "LIST", "reason": "gone", "object": listing}])
    assert summary(events) == [("lease_acquired", "c", 3, 550)]
    assert events[0]["attrs"]["after_gap"] == "gone"
    assert not w.gone and w.resource_version == "560"
    assert (
        registry.get_sample_value(
            "splitbrain_watch_gaps_total", {"watcher": "kubernetes", "reason": "gone"}
        )
        == 1.0
    )


def test_a_restart_resumes_without_taking_a_renewal_for_a_new_holder() -> None:
    w, _ = watcher()
    feed(w, [modified(lease(600, "pod-a"))])
    again, _ = watcher()
    again.restore(json.loads(json.dumps(w.state())))
    events = feed(again, [modified(lease(601, "pod-a", renew="2026-12-02T10:00:05Z"))])
    assert summary(events) == [("heartbeat", "pod-a", 600, 601)]


def test_the_recorded_stream_replays_to_what_the_live_watcher_published() -> None:
    stream = [
        json.loads(line) for line in (RECORDED / "lease-watch.jsonl").read_text().splitlines()
    ]
    published = (RECORDED / "input.jsonl").read_bytes().splitlines()
    from_watcher = [
        json.loads(line) for line in published if json.loads(line)["event_id"].startswith("k8s:")
    ]
    w, _ = watcher()
    replayed = feed(w, stream)
    fields = ("event_id", "kind", "owner_epoch", "worker_id", "seq")
    assert [tuple(e[f] for f in fields) for e in replayed] == [
        tuple(e[f] for f in fields) for e in from_watcher
    ]
    assert {e["kind"] for e in replayed} >= {"lease_acquired", "heartbeat"}
    findings = audit_lines(iter(published)).findings.values()
    assert any(f.severity.value == "critical" for f in findings)


def test_stopped_leading_stops_work_that_never_looks_at_its_stop_event() -> None:
    """The elector's own callbacks, as `LeaderElection.run` calls them (the Lease write that
    won is given as the API server returned it); the real server is in the slow test."""
    recorder = Recorder()
    sink = AdapterSink("kubernetes", publisher=lambda: recorder, registry=CollectorRegistry())
    effects: list[int] = []
    working = threading.Event()

    def work(stop: threading.Event) -> None:
        while True:  # a zombie in the making: it never checks `stop`
            effect_committed(f"report/{len(effects)}")
            effects.append(1)
            working.set()
            time.sleep(0.01)

    elector = LeaderElector("payments-leader", "default", "pod-a", work, sink)
    elector.lock.acquired = V1Lease(
        metadata=V1ObjectMeta(name="payments-leader", resource_version="77"), spec=V1LeaseSpec()
    )
    thread = threading.Thread(target=elector._started)
    thread.start()
    assert working.wait(10)
    elector._stopped()
    thread.join(10)
    assert not thread.is_alive() and elector.stop.is_set()
    done = len(effects)
    time.sleep(0.05)
    assert len(effects) == done  # nothing more after the thread ended
    assert sink.flush(10)
    kinds = [e.kind.value for e in recorder.events]
    assert kinds[-1] == "lease_lost" and set(kinds[:-1]) <= {"effect_committed"}
    assert {(e.workflow_key, e.owner_epoch, e.worker_id) for e in recorder.events} == {
        ("default/payments-leader", 77, "pod-a")
    }
    assert (recorder.events[0].attrs or {}).get("epoch_from") == "kubernetes.resourceVersion"
    # The Lease in its own words on every event, the work's effects included (DESIGN §5).
    for event in recorder.events:
        assert event.detail == {
            "lease": "payments-leader",
            "namespace": "default",
            "holder_identity": "pod-a",
        }  # no leaseTransitions in this Lease: none said
    sink.close()


def test_an_election_that_raises_while_leading_stops_the_work() -> None:
    """The Python client's renew loop raises when the API server cannot be reached (a partition:
    only API errors are retried) and never calls "stopped leading": the work must stop all the
    same, with its `lease_lost`, and the error reach the caller."""
    recorder = Recorder()
    sink = AdapterSink("kubernetes", publisher=lambda: recorder, registry=CollectorRegistry())
    working = threading.Event()
    ended = threading.Event()

    def work(stop: threading.Event) -> None:
        try:
            while True:  # never checks `stop`
                working.set()
                time.sleep(0.01)
        finally:
            ended.set()

    elector = LeaderElector("payments-leader", "default", "pod-a", work, sink)
    elector.lock.acquired = V1Lease(
        metadata=V1ObjectMeta(name="payments-leader", resource_version="77"), spec=V1LeaseSpec()
    )

    def renew_loop_fails() -> None:  # what `LeaderElection.run` does, its renewal failing
        threading.Thread(target=elector._started, daemon=True).start()
        assert working.wait(10)
        raise ConnectionError("Max retries exceeded with url: /apis/coordination.k8s.io/v1")

    elector._election.run = renew_loop_fails  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        elector.run()
    assert elector.stop.is_set() and ended.wait(10)
    assert sink.flush(10)
    assert [e.kind.value for e in recorder.events] == ["lease_lost"]
    sink.close()


def stepping_down(elector: LeaderElector, working: threading.Event) -> None:
    """In place of `LeaderElection.run`: the work started in a thread of its own, then
    leadership lost and "stopped leading" called, and the client returns at once."""

    def run() -> None:
        threading.Thread(target=elector._started, daemon=True).start()
        assert working.wait(10)
        elector._stopped()

    elector._election.run = run  # type: ignore[method-assign]
    elector.lock.acquired = V1Lease(
        metadata=V1ObjectMeta(name="payments-leader", resource_version="77"), spec=V1LeaseSpec()
    )


def test_run_returns_after_the_work_s_last_write() -> None:
    """A host that exits (closing its sink) once `run` returns must still report the write the
    work had in flight when leadership ended."""
    recorder = Recorder()
    sink = AdapterSink("kubernetes", publisher=lambda: recorder, registry=CollectorRegistry())
    working = threading.Event()
    reported: list[float] = []

    def work(stop: threading.Event) -> None:
        try:
            while True:  # ended by the `LeadershipLostError` raised in its thread
                working.set()
                time.sleep(0.01)
        finally:  # the write in flight when leadership ended
            time.sleep(0.2)
            effect_committed("report/last")
            reported.append(time.monotonic())

    elector = LeaderElector("payments-leader", "default", "pod-a", work, sink)
    stepping_down(elector, working)
    elector.run()
    returned = time.monotonic()
    assert reported and reported[0] <= returned
    sink.close()
    assert [e.kind.value for e in recorder.events] == ["lease_lost", "effect_committed"]


def test_run_waits_for_the_work_no_longer_than_its_stop_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Work stuck in a blocking call never sees the stop: `run` returns at the bound and says
    so, naming the setting."""
    sink = AdapterSink("kubernetes", publisher=Recorder, registry=CollectorRegistry())
    working = threading.Event()
    release = threading.Event()

    def work(stop: threading.Event) -> None:
        working.set()
        release.wait(10)  # a C call: the raised stop waits for it

    elector = LeaderElector("payments-leader", "default", "pod-a", work, sink, stop_timeout=0.1)
    stepping_down(elector, working)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        elector.run()
    assert time.monotonic() - started < 5
    (line,) = [r.getMessage() for r in caplog.records if "stop_timeout" in r.getMessage()]
    assert line.startswith("kubernetes: pod-a's work still runs 0.1s after leadership ended")
    release.set()
    sink.close()
    with pytest.raises(ValueError, match="stop_timeout"):
        LeaderElector("l", "default", "pod-a", work, sink, stop_timeout=-1)


def test_the_elector_keeps_lease_transitions_as_client_go_so_a_relist_knows_its_epoch() -> None:
    """0 at creation, one more when the holder changes, none on a renewal; a Lease another
    elector wrote without transitions is left so (its epoch stays its resourceVersion). A
    watcher that missed the acquiring write then relists the holder at the epoch it works
    under, not at the listed resourceVersion (the campaign's false critical after an API
    server restart)."""
    lock = _RecordingLeaseLock("shard", "default", "w2")  # type: ignore[no-untyped-call]

    def record(holder: str) -> LeaderElectionRecord:
        now = "2026-12-05 04:28:30.558611"  # as the client's elector writes its times
        return LeaderElectionRecord(holder, "15", now, now)  # type: ignore[no-untyped-call]

    created = lock.get_lease_spec(record("w1"))
    assert created.lease_transitions == 0
    taken = lock.get_lease_spec(record("w2"), created)
    assert taken.lease_transitions == 1
    assert lock.get_lease_spec(record("w2"), taken).lease_transitions == 1
    foreign = V1LeaseSpec(holder_identity="w1", lease_transitions=None)
    assert lock.get_lease_spec(record("w2"), foreign).lease_transitions is None
    w, _ = watcher()
    relisted = w.relist([lease(925, "w2", transitions=1)], "925", reason="gone")
    assert [(e["kind"], e["owner_epoch"]) for e in relisted] == [("lease_acquired", 1)]


class LeaseReads:
    """The API server's answer to the elector's Lease read (unparsed, as the elector asks for
    it): its holder, transitions and resourceVersion."""

    def __init__(self, holder: str, transitions: int, rv: int) -> None:
        self.data = json.dumps(lease(rv, holder, transitions=transitions)).encode()

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> LeaseReads:
        return self


def attempted(now: LeaseReads) -> tuple[list[dict[str, Any]], bool]:
    """Pod A's acquisition (transition 1 at rv 70) and one attempt of A's against `now`, as
    the audit input they make, with the attempt's answer."""
    recorder = Recorder()
    sink = AdapterSink("kubernetes", publisher=lambda: recorder, registry=CollectorRegistry())
    answer: list[bool] = []
    elector = LeaderElector(
        "payments-leader",
        "default",
        "pod-a",
        lambda stop: answer.append(elector.attempt("pay/1")),
        sink,
    )
    elector.lock.api_instance = now  # type: ignore[assignment]
    elector.lock.acquired = V1Lease(
        metadata=V1ObjectMeta(resource_version="70"), spec=V1LeaseSpec(lease_transitions=1)
    )
    elector._started()
    assert sink.flush(10)
    sink.close()
    a = lease(70, "pod-a", transitions=1)
    acquired = feed(watcher()[0], [{"type": "ADDED", "object": a}])
    events = [json.loads(e.model_dump_json(exclude_none=True)) for e in recorder.events]
    return [*acquired, *events], answer[0]


def findings_of(events: list[dict[str, Any]]) -> list[Any]:
    lines = [json.dumps(e, default=str).encode() for e in events]
    return list(audit_lines(iter(lines)).findings.values())


def test_an_attempt_before_the_takeover_arriving_after_it_raises_nothing() -> None:
    """An attempt buffered through a Kafka outage arrives after the watcher's record of the
    next holder: the Lease's resourceVersion, not arrival, places it before the takeover."""
    (acquired, attempt), held = attempted(LeaseReads("pod-a", 1, 74))
    assert held and attempt["kind"] == "effect_attempted" and attempt["seq"] == 74
    takeover = feed(watcher()[0], [{"type": "ADDED", "object": lease(80, "pod-b", transitions=2)}])
    assert findings_of([acquired, *takeover, attempt]) == []


def test_an_attempt_after_the_takeover_is_stale_by_the_api_server_s_order() -> None:
    (acquired, attempt), held = attempted(LeaseReads("pod-b", 2, 80))
    assert not held
    takeover = feed(watcher()[0], [{"type": "ADDED", "object": lease(80, "pod-b", transitions=2)}])
    (finding,) = findings_of([acquired, *takeover, attempt])
    assert [c.kind for c in finding.conditions] == ["stale_effect_attempt"]
    assert finding.ordering == "authoritative_seq"


def committed_at(rv: int) -> list[dict[str, Any]]:
    """Pod A's acquisition (transition 1 at rv 70) and its work's write the API server answered
    at resourceVersion `rv`, reported with `LeaderElector.committed`, as the audit input."""
    recorder = Recorder()
    sink = AdapterSink("kubernetes", publisher=lambda: recorder, registry=CollectorRegistry())
    sent: list[bool] = []
    elector = LeaderElector(
        "payments-leader",
        "default",
        "pod-a",
        lambda stop: sent.append(elector.committed("pay/1", str(rv), destination="configmap")),
        sink,
    )
    elector.lock.acquired = V1Lease(
        metadata=V1ObjectMeta(resource_version="70"), spec=V1LeaseSpec(lease_transitions=1)
    )
    elector._started()
    assert sent == [True]
    assert sink.flush(10)
    sink.close()
    a = lease(70, "pod-a", transitions=1)
    acquired = feed(watcher()[0], [{"type": "ADDED", "object": a}])
    events = [json.loads(e.model_dump_json(exclude_none=True)) for e in recorder.events]
    return [*acquired, *events]


def test_a_write_after_the_takeover_arriving_before_it_is_stale_by_the_api_server_s_order() -> None:
    """The campaign's miss (kubernetes, seed 1, run 2): the API server restarted, the watcher
    relisted late, and a displaced holder's write at resourceVersion 439 arrived before the
    takeover at 437 it followed. By arrival it was no one's stale write; by the write's
    resourceVersion it is."""
    acquired, commit = committed_at(439)
    assert commit["kind"] == "effect_committed" and commit["seq"] == 439
    assert commit["source"] == "destination"
    takeover = feed(watcher()[0], [{"type": "ADDED", "object": lease(437, "pod-b", transitions=2)}])
    (finding,) = findings_of([acquired, commit, *takeover])
    assert [c.kind for c in finding.conditions] == ["stale_effect_committed"]
    assert finding.ordering == "authoritative_seq"


def test_a_write_before_the_takeover_arriving_after_it_raises_nothing() -> None:
    acquired, commit = committed_at(74)
    takeover = feed(watcher()[0], [{"type": "ADDED", "object": lease(80, "pod-b", transitions=2)}])
    assert findings_of([acquired, *takeover, commit]) == []
