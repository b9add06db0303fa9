"""`LockWatcher` fed the etcd gateway's JSON as a watch delivers it: who holds a lock or an
election, how its end is told, and bad input counted without stopping the watch. The real
server, the broker and the worker are in tests/integration/test_adapter_etcd.py."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("etcd3gw", reason="the etcd extra is not installed (.[etcd])")

from detector.adapters import AdapterSink, effect_committed
from detector.adapters._etcd_watch import InvalidKvError, Kv, parse_response
from detector.adapters._watch import WatchMetrics
from detector.adapters.etcd import LockOwner, LockWatcher
from detector.contracts.events import Kind, OwnershipEvent, parse_event_obj
from tests.unit.histories import run
from tests.unit.test_adapter_sink import Recorder

PREFIX = "/election/payments/"
LIVE, GONE = 0x1A, 0x2B  # leases: one alive, one expired


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def put(key: str, create: int, mod: int, lease: int) -> dict[str, Any]:
    kv = {"key": b64(key), "create_revision": str(create), "mod_revision": str(mod)}
    return {"kv": {**kv, "lease": str(lease), "version": "1"}}


def delete(key: str, mod: int) -> dict[str, Any]:
    return {"type": "DELETE", "kv": {"key": b64(key), "mod_revision": str(mod)}}


def response(revision: int, *events: dict[str, Any]) -> Any:
    return parse_response({"result": {"header": {"revision": str(revision)}, "events": events}})


def ttl(lease: int) -> tuple[int, int]:
    return (-1, 0) if lease == GONE else (7, 10)


def watcher() -> tuple[LockWatcher, CollectorRegistry]:
    registry = CollectorRegistry()
    return LockWatcher([PREFIX], ttl, WatchMetrics("etcd", registry)), registry


def kinds(events: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    for e in events:
        parse_event_obj(e)  # every event is valid input
    return [(e["kind"], e["owner_epoch"], e["seq"]) for e in events]


def test_the_holder_is_the_oldest_key_and_an_expired_lease_is_a_loss() -> None:
    w, _ = watcher()
    a, b = f"{PREFIX}{GONE:x}", f"{PREFIX}{LIVE:x}"
    assert w.relist(PREFIX, 4, [], reason="start") == []
    assert kinds(w.apply(PREFIX, response(5, put(a, 5, 5, GONE)))) == [("lease_acquired", 5, 5)]
    assert w.apply(PREFIX, response(6, put(b, 6, 6, LIVE))) == []  # a candidate waiting
    # etcd removes A's key with its expired lease: A lost it, B holds from that revision.
    assert kinds(w.apply(PREFIX, response(9, delete(a, 9)))) == [
        ("lease_lost", 5, 9),
        ("lease_acquired", 6, 9),
    ]
    ended = w.apply(PREFIX, response(12, delete(b, 12)))
    assert kinds(ended) == [("lease_released", 6, 12)]  # its lease alive: it let go
    assert ended[0]["source"] == "coordinator"
    assert ended[0]["attrs"]["epoch_from"] == "etcd.create_revision"


def test_a_holder_is_named_by_its_key_and_lease_and_a_takeover_by_its_cause() -> None:
    """DESIGN §5 `context`: the holder's key and lease id (hex, as etcdctl prints it), and for
    a takeover why the previous holder's key went."""
    w, _ = watcher()
    a, b = f"{PREFIX}{GONE:x}", f"{PREFIX}{LIVE:x}"
    w.relist(PREFIX, 4, [], reason="start")
    (first,) = w.apply(PREFIX, response(5, put(a, 5, 5, GONE)))
    w.apply(PREFIX, response(6, put(b, 6, 6, LIVE)))
    lost, taken = w.apply(PREFIX, response(9, delete(a, 9)))
    assert first["detail"] == {"key": a, "lease_id": "2b"}
    assert lost["detail"] == {"key": a, "lease_id": "2b"}
    assert taken["detail"] == {"key": b, "lease_id": "1a", "cause": "lease_expired_or_revoked"}


class FakeEtcd:
    """The etcd3gw client calls `LockOwner` makes, answered as etcd would."""

    def __init__(self) -> None:
        self.applied = True
        self.revision = 7  # the store's revision, as the next range read reports it
        self.holder_created = 5  # the lock key's create_revision (another holder: higher)

    def get(self, key: str, metadata: bool = False) -> list[tuple[bytes, dict[str, Any]]]:
        return [(b"held", {"lease": str(LIVE), "create_revision": "5"})]

    def get_url(self, path: str) -> str:
        return path

    def post(self, url: str, json: dict[str, Any]) -> dict[str, Any]:
        if url == "/kv/range":
            kv = {"key": json["key"], "create_revision": str(self.holder_created)}
            return {"header": {"revision": str(self.revision)}, "kvs": [kv]}
        return {"result": {"TTL": "10", "header": {"revision": "7"}}}

    def transaction(self, txn: dict[str, Any]) -> dict[str, Any]:
        return {"succeeded": self.applied, "header": {"revision": "8"}}


def test_the_holder_s_events_name_its_lock_key_and_lease() -> None:
    recorder = Recorder()
    sink = AdapterSink("etcd", publisher=lambda: recorder, registry=CollectorRegistry())
    with LockOwner(FakeEtcd(), "/locks/pay", LIVE, sink) as owner:  # type: ignore[arg-type]
        owner.keepalive()
        owner.put("/ledger/42", "paid", effect_key="charge/42")
        assert effect_committed("email/42")
    assert sink.flush(10)
    said = {"key": "/locks/pay", "lease_id": "1a"}
    assert [e.kind for e in recorder.events] == [
        Kind.HEARTBEAT,
        Kind.EFFECT_COMMITTED,
        Kind.EFFECT_COMMITTED,
    ]
    for event in recorder.events:
        assert event.detail is not None and event.detail.items() >= said.items()
    assert (recorder.events[1].detail or {})["fenced"] is True
    sink.close()


def test_a_sibling_key_is_not_part_of_the_lock() -> None:
    w = LockWatcher(["/locks/pay"], ttl, WatchMetrics("etcd", CollectorRegistry()))
    assert w.apply("/locks/pay", response(3, put("/locks/payroll", 3, 3, LIVE))) == []
    assert kinds(w.apply("/locks/pay", response(4, put("/locks/pay", 4, 4, LIVE)))) == [
        ("lease_acquired", 4, 4)
    ]


def invalid_count(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value(
        "splitbrain_watch_events_invalid_total", {"watcher": "etcd", "reason": reason}
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_an_unreadable_key_value_is_counted_logged_with_its_key_and_the_watch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w, registry = watcher()
    bad = {"kv": {"key": b64(f"{PREFIX}x"), "create_revision": "soon", "mod_revision": "5"}}
    not_base64 = {"kv": {"key": "%%%", "create_revision": "5", "mod_revision": "5"}}
    with caplog.at_level(logging.WARNING):
        events = w.apply(PREFIX, response(6, bad, not_base64, put(f"{PREFIX}{LIVE:x}", 6, 6, LIVE)))
    assert kinds(events) == [("lease_acquired", 6, 6)]
    assert invalid_count(registry, "bad_create_revision") == 1.0
    assert invalid_count(registry, "bad_key") == 1.0
    logged = warnings(caplog)
    assert any(f"bad_create_revision: key '{PREFIX}x'" in line for line in logged), logged
    assert any("bad_key: key '%%%'" in line for line in logged), logged
    # The watch goes on: the next revision is applied as usual.
    assert kinds(w.apply(PREFIX, response(9, delete(f"{PREFIX}{LIVE:x}", 9)))) == [
        ("lease_released", 6, 9)
    ]


def test_a_relist_after_compaction_reports_a_new_holder_marked_and_at_the_listing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w, registry = watcher()
    w.apply(PREFIX, response(5, put(f"{PREFIX}{GONE:x}", 5, 5, GONE)))
    compacted = parse_response(
        {"result": {"header": {"revision": "40"}, "compact_revision": "30", "canceled": True}}
    )
    unreadable = InvalidKvError("bad_lease", f"{PREFIX}y")  # a key the listing could not read
    with caplog.at_level(logging.WARNING):
        w.compacted(PREFIX, compacted)
        relisted = w.relist(
            PREFIX, 40, [Kv(f"{PREFIX}{LIVE:x}", 20, 20, LIVE)], [unreadable], reason="compacted"
        )
    # Never silent: the gap is logged with the watched prefix and the revisions it spans, and
    # an unreadable key of the listing is counted and logged with its key.
    logged = warnings(caplog)
    assert any(
        f"{PREFIX!r} compacted at revision 30 (last seen 5): relisting" in line for line in logged
    ), logged
    assert any(f"bad_lease: key '{PREFIX}y'" in line for line in logged), logged
    assert invalid_count(registry, "bad_lease") == 1.0
    # Its predecessor's end is what the gap lost: no event for it; the acquisition at 40.
    assert kinds(relisted) == [("lease_acquired", 20, 40)]
    assert relisted[0]["attrs"]["after_gap"] == "compacted"
    assert (
        registry.get_sample_value(
            "splitbrain_watch_gaps_total", {"watcher": "etcd", "reason": "compacted"}
        )
        == 1.0
    )


def test_a_restart_resumes_from_the_saved_state_without_repeating_itself() -> None:
    w, _ = watcher()
    w.apply(PREFIX, response(5, put(f"{PREFIX}{LIVE:x}", 5, 5, LIVE)))
    again, _ = watcher()
    again.restore(w.state())
    assert again.units[PREFIX].revision == 5
    assert again.apply(PREFIX, response(5, put(f"{PREFIX}{LIVE:x}", 5, 5, LIVE))) == []
    assert kinds(again.apply(PREFIX, response(8, delete(f"{PREFIX}{LIVE:x}", 8)))) == [
        ("lease_released", 5, 8)
    ]


def takeover_at(revision: int, lock_key: str = "/locks/pay") -> OwnershipEvent:
    """The watcher's record of the next holder, whose key etcd created at `revision`."""
    return parse_event_obj(
        {
            "workflow_key": lock_key,
            "kind": "lease_acquired",
            "owner_epoch": revision,
            "worker_id": "lease-2b",
            "observed_at": "2026-12-05T07:00:00Z",
            "seq": revision,
            "event_id": f"etcd:{revision}:acquired:{revision}",
            "source": "coordinator",
        }
    )


def attempts_then(etcd: FakeEtcd, *, after_takeover: bool) -> tuple[list[OwnershipEvent], bool]:
    """The holder's acquisition and one attempt, made before or after a takeover at 9."""
    recorder = Recorder()
    sink = AdapterSink("etcd", publisher=lambda: recorder, registry=CollectorRegistry())
    with LockOwner(etcd, "/locks/pay", LIVE, sink) as owner:  # type: ignore[arg-type]
        if after_takeover:
            etcd.revision, etcd.holder_created = 11, 9
        held = owner.attempt("charge/42", destination="psp")
    assert sink.flush(10)
    sink.close()
    acquired = takeover_at(5).model_copy(update={"worker_id": f"lease-{LIVE:x}", "event_id": "a"})
    return [acquired, *recorder.events], held


def test_an_attempt_before_the_takeover_whose_event_arrives_after_it_raises_nothing() -> None:
    """A holder's attempt buffered through a Kafka outage arrives after the watcher's record of
    the next holder: etcd's revision, not arrival, places it before the takeover."""
    (acquired, attempt), held = attempts_then(FakeEtcd(), after_takeover=False)
    assert held and attempt.kind is Kind.EFFECT_ATTEMPTED and attempt.seq == 7
    assert run([acquired, takeover_at(9), attempt]).findings() == []


def test_an_attempt_after_the_takeover_is_stale_by_etcd_s_order() -> None:
    (acquired, attempt), held = attempts_then(FakeEtcd(), after_takeover=True)
    assert not held  # the lock key is another holder's now
    (finding,) = run([acquired, takeover_at(9), attempt]).findings()
    assert [c.kind for c in finding.conditions] == ["stale_effect_attempt"]
    assert finding.ordering == "authoritative_seq"
    assert finding.severity == "warning"
