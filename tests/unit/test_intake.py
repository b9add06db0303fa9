"""The worker's edge (both runtimes): only a required field, a size or a key dead-letters."""

import json

from detector.contracts.dead_letters import DeadLetter
from detector.contracts.events import MAX_EVENT_BYTES, OwnershipEvent
from detector.runtime.intake import admit
from detector.testing.torture.poison import corpus, kept_with_a_dropped_field

EVENT = {
    "event_id": "e8",
    "kind": "effect_committed",
    "workflow_key": "wf",
    "owner_epoch": 17,
    "worker_id": "alpha",
    "effect_key": "release-index",
    "source": "destination",
    "seq": 8,
}


def admitted(**changes: object) -> OwnershipEvent | DeadLetter:
    value = json.dumps({**EVENT, **changes}).encode()
    return admit(b"wf", value, "agent.ownership.v1", 0, 42)


def test_an_invalid_optional_field_is_dropped_never_dead_lettered() -> None:
    event = admitted(observed_at="2026-07-26T10:00:24", lease_duration_s=0, trace_id="ABC")
    assert isinstance(event, OwnershipEvent)
    assert (event.kind.value, event.effect_key, event.seq) == (
        "effect_committed",
        "release-index",
        8,
    )
    assert sorted(d.field for d in event.dropped_fields) == [
        "lease_duration_s",
        "observed_at",
        "trace_id",
    ]


DEEP = b'{"n": ' * 300 + b"1" + b"}" * 300  # deeper than the JSON parser allows


def test_an_unreadable_optional_part_is_dropped_never_dead_lettered() -> None:
    """DESIGN §3: nesting deeper than a parser allows, an unpaired surrogate, a name given twice
    inside `attrs` or `detail`: when the required fields can be read, the event is kept."""
    head = json.dumps(EVENT).encode()[:-1]
    for member, field in (
        (b'"detail": ' + DEEP, "detail"),
        (b'"detail": {"note": "\\ud800"}', "detail"),
        (b'"attrs": {"model": "a", "model": "b"}', "attrs"),
        (b'"heartbeat_interval_s": true', "heartbeat_interval_s"),
    ):
        event = admit(b"wf", head + b", " + member + b"}", "agent.ownership.v1", 0, 42)
        assert isinstance(event, OwnershipEvent), member
        assert (event.kind.value, event.effect_key) == ("effect_committed", "release-index")
        assert [d.field for d in event.dropped_fields] == [field]
    event = admit(b"wf", head + b', "x": ' + DEEP + b"}", "agent.ownership.v1", 0, 42)
    assert isinstance(event, OwnershipEvent) and event.dropped_fields == ()  # unknown: ignored


def test_an_unreadable_required_field_is_still_dead_lettered_with_its_name() -> None:
    for field, value in (
        ("owner_epoch", DEEP),
        ("worker_id", b'"\\ud800"'),
        ("owner_epoch", b"true"),
    ):
        doc = json.dumps({k: v for k, v in EVENT.items() if k != field}).encode()[:-1]
        dead = admit(b"wf", doc + b', "' + field.encode() + b'": ' + value + b"}", "in", 0, 42)
        assert isinstance(dead, DeadLetter), (field, value)
        assert (dead.reason_code, dead.field) == ("invalid", field)


def test_an_invalid_required_field_is_dead_lettered_with_its_name() -> None:
    dead = admitted(owner_epoch="17")
    assert isinstance(dead, DeadLetter)
    assert (dead.reason_code, dead.field, dead.offset) == ("invalid", "owner_epoch", 42)


def test_an_effect_key_the_kind_needs_is_required() -> None:
    dead = admitted(effect_key="")
    assert isinstance(dead, DeadLetter) and dead.field == "effect_key"


def test_one_field_under_two_names_that_disagree_is_dead_lettered() -> None:
    dead = admitted(job="other-wf")
    assert isinstance(dead, DeadLetter)
    assert (dead.reason_code, dead.field) == ("invalid", "workflow_key")
    assert "given twice" in dead.reason


def test_an_epoch_written_twice_is_dead_lettered_naming_it() -> None:
    value = json.dumps(EVENT).encode()[:-1] + b', "owner_epoch": 99}'
    dead = admit(b"wf", value, "agent.ownership.v1", 0, 42)
    assert isinstance(dead, DeadLetter)
    assert (dead.reason_code, dead.field) == ("invalid", "owner_epoch")
    assert "given twice" in dead.reason


def test_the_size_limit_is_the_one_audit_applies() -> None:
    padding = "x" * MAX_EVENT_BYTES
    dead = admitted(destination=padding)
    assert isinstance(dead, DeadLetter) and dead.reason_code == "too_large"


def test_the_poison_corpus_is_all_dead_lettered_and_the_kept_records_are_all_kept() -> None:
    """The torture run and the worker tests count dead letters against `corpus()`: it must hold
    only records a required field, the size or the key condemns (DESIGN §3)."""
    poison = corpus(largest_value=1_000_000)
    assert len(poison) >= 50
    for name, key, value in poison:
        assert isinstance(admit(key, value, "in", 0, 0), DeadLetter), name
    for name, key, value in kept_with_a_dropped_field():
        event = admit(key, value, "in", 0, 0)
        assert isinstance(event, OwnershipEvent), name
        assert len(event.dropped_fields) == 1, name
