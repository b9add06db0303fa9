"""Local state stores behave as the engine's mapping, and keep only what was committed."""

from pathlib import Path

import pytest

from detector.contracts.events import parse_event_obj
from detector.core import (
    Config,
    Detector,
    SweepMarks,
    WorkflowState,
    decode_state,
    encode_state,
    sweep_marks,
)
from detector.runtime.store import MemoryStore, RocksStore, Store

DATA = Path(__file__).parent / "data"
DAY = 24 * 3600.0


def event(seq: int, kind: str = "heartbeat", epoch: int = 1, wf: str = "wf") -> dict[str, object]:
    return {
        "event_id": f"e{seq}",
        "kind": kind,
        "workflow_key": wf,
        "owner_epoch": epoch,
        "worker_id": f"w{epoch}",
        "seq": seq,
    }


def encoded_states(now: float) -> dict[str, bytes]:
    """One workflow of each kind the idle sweep tells apart, as a changelog holds them."""
    d = Detector()
    split = [event(1, "lease_acquired"), event(2, "lease_acquired", 2), event(3)]
    for e in split:  # a stale heartbeat: an open finding, watched at every tick
        d.observe(parse_event_obj({**e, "workflow_key": "open"}), at=now - 60)
    d.observe(parse_event_obj(event(1, "lease_acquired", wf="idle")), at=now - 8 * DAY)
    d.observe(parse_event_obj(event(1, "lease_acquired", wf="busy")), at=now - 60)
    for seq, kind in ((1, "lease_acquired"), (2, "lease_released")):
        d.observe(parse_event_obj(event(seq, kind, wf="released")), at=now - 2 * DAY)
    states = {key: encode_state(state) for key, state in d.states.items()}
    # Remnants: one made a day ago, one past `remnant_ttl_s`, one of a version that kept no time.
    past = ((1, False, 3, "critical", 12345),)
    ttl = Config().remnant_ttl_s
    for key, made in (("remnant", now - DAY), ("expired", now - ttl), ("unstamped", None)):
        states[key] = encode_state(WorkflowState(pos=9, max_seq=9, last_at=made, past=past))
    return states


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else RocksStore(tmp_path / "p0")


def test_engine_runs_on_the_store_and_a_restore_continues_it(store: Store, tmp_path: Path) -> None:
    d = Detector(states=store.states)
    for e in (event(1, "lease_acquired"), event(2, "lease_acquired", 2), event(3)):
        updates = d.observe(parse_event_obj(e))
    assert [u.finding.revision for u in updates] == [1]
    raw = encode_state(store.states["wf"])
    store.put("wf", raw)
    store.committed()
    assert list(store.states) == ["wf"]

    restored = RocksStore(tmp_path / "p1") if isinstance(store, RocksStore) else MemoryStore()
    restored.load("wf", raw)
    again = Detector(states=restored.states)
    more = again.observe(parse_event_obj({**event(4, "effect_attempted"), "effect_key": "k"}))
    assert [(u.finding.revision, u.finding.severity.value) for u in more] == [(2, "warning")]


def test_deleted_workflows_are_gone_after_commit(store: Store) -> None:
    store.load("wf", encode_state(WorkflowState()))
    del store.states["wf"]
    assert "wf" not in store.states
    store.put("wf", None)
    store.committed()
    assert "wf" not in store.states
    assert len(store.states) == 0


def test_rocks_store_keeps_decoded_copies_only_until_commit(tmp_path: Path) -> None:
    rocks = RocksStore(tmp_path / "p")
    rocks.load("wf", encode_state(WorkflowState()))
    first = rocks["wf"]
    first.pos = 99  # an uncommitted change the engine made in place
    assert rocks["wf"].pos == 99
    rocks.committed()  # it was not put: the committed copy wins
    assert rocks["wf"].pos == 0
    rocks.close()
    assert not (tmp_path / "p").exists()


def test_length_counts_committed_and_pending_workflows(store: Store) -> None:
    states = store.states
    for key in ("a", "b", "c"):
        store.load(key, encode_state(WorkflowState()))
    store.load("b", encode_state(WorkflowState(pos=1)))  # a newer record of the same key
    store.load("gone", encode_state(WorkflowState()))
    store.load("gone", None)  # its tombstone
    assert len(states) == 3
    states["d"] = WorkflowState()  # new, not committed yet
    del states["a"]  # deleted, not committed yet
    assert len(states) == len(list(states)) == 3
    store.put("d", encode_state(states["d"]))
    store.put("a", None)
    store.committed()
    assert len(states) == len(list(states)) == 3
    assert sorted(states) == ["b", "c", "d"]


def test_a_restored_state_is_decoded_only_when_due(store: Store) -> None:
    """The first sweep after a restore finds the open finding and evicts the idle and released
    workflows, without decoding the workflow that is none of these."""
    now = 1_800_000_000.0
    for key, raw in encoded_states(now).items():
        store.load(key, raw)
    store.committed()
    states = store.states
    assert isinstance(states, MemoryStore | RocksStore)
    cfg = Config()
    due = (now - cfg.idle_ttl_s, now - cfg.remnant_ttl_s)
    swept = ["expired", "idle", "open", "released", "unstamped"]
    assert sorted(states.sweep_keys(*due)) == swept
    d = Detector(states=states)
    d.advance(now)
    assert sum(d.open_findings().values()) == 1
    assert sorted(states) == ["busy", "open", "remnant", "unstamped"]
    assert states["unstamped"].last_at == now  # its time starts at the first sweep that sees it
    assert d.counters.evicted_expired == 1
    assert sorted(states.sweep_keys(*due)) == ["open", "unstamped"]  # decoded
    more = d.observe(parse_event_obj({**event(4), "workflow_key": "open"}), at=now)
    assert [u.finding.revision for u in more] == [2]  # the restored finding goes on


@pytest.mark.parametrize("name", ["state-v1-export-ledger.json", "state-v2-export-ledger.msgpack"])
def test_sweep_marks_read_every_state_version(name: str) -> None:
    raws = [*encoded_states(1_800_000_000.0).values(), (DATA / name).read_bytes().strip()]
    for raw in raws:
        assert sweep_marks(raw) == SweepMarks.of(decode_state(raw))
