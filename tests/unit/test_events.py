"""The input contract at the edge: aliases fold in, limits hold, errors name the field."""

import json

import pytest

from detector.events import EventError, Kind, parse_event_json, parse_event_obj

BASE = {
    "event_id": "e1",
    "kind": "heartbeat",
    "workflow_key": "wf",
    "owner_epoch": 3,
    "worker_id": "w1",
}


def raw(**changes: object) -> bytes:
    doc = {**BASE, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("alias", "kind"),
    [
        ("job_claimed", Kind.LEASE_ACQUIRED),
        ("heartbeat_ok", Kind.HEARTBEAT),
        ("heartbeat_lost", Kind.LEASE_LOST),
        ("tool_request_started", Kind.EFFECT_ATTEMPTED),
        ("result_rejected", Kind.EFFECT_REJECTED),
    ],
)
def test_job_queue_kinds_fold_into_canonical_kinds(alias: str, kind: Kind) -> None:
    event = parse_event_json(raw(kind=alias, effect_key="k"))
    assert event.kind is kind


def test_job_queue_field_aliases() -> None:
    for epoch_field in ("token", "fencing_token"):
        for worker_field in ("worker", "owner_id"):
            event = parse_event_obj(
                {
                    "event_id": "e",
                    "kind": "job_claimed",
                    "job": "8f1b",
                    epoch_field: 42,
                    worker_field: "w1",
                }
            )
            assert (event.workflow_key, event.owner_epoch, event.worker_id) == ("8f1b", 42, "w1")


def test_result_rejected_names_the_result_as_its_effect() -> None:
    assert parse_event_json(raw(kind="result_rejected")).effect_key == "result"


def test_unknown_fields_are_ignored() -> None:
    assert parse_event_json(raw(shiny_new_field={"x": 1})).event_id == "e1"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"event_id": None}, "event_id"),
        ({"kind": "teleported"}, "kind"),
        ({"owner_epoch": -1}, "owner_epoch"),
        ({"owner_epoch": 2**64}, "owner_epoch"),
        ({"owner_epoch": "17"}, "owner_epoch"),
        ({"owner_epoch": True}, "owner_epoch"),
        ({"workflow_key": "x" * 513}, "workflow_key"),
        ({"event_id": "x" * 129}, "event_id"),
        ({"source": "oracle"}, "source"),
        ({"observed_at": "2026-07-26T10:00:00"}, "observed_at"),
        ({"seq": -3}, "seq"),
        ({"trace_id": "not-hex"}, "trace_id"),
        ({"detail": {"blob": "x" * 5000}}, "detail"),
    ],
)
def test_bad_events_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(EventError) as err:
        parse_event_json(raw(**changes))
    assert err.value.field == field


@pytest.mark.parametrize("kind", ["effect_attempted", "effect_committed", "outcome_verified"])
def test_effect_kinds_need_an_effect_key(kind: str) -> None:
    with pytest.raises(EventError, match="effect_key is required"):
        parse_event_json(raw(kind=kind))


def test_truncated_json_is_an_event_error() -> None:
    with pytest.raises(EventError):
        parse_event_json(raw()[:-5])
