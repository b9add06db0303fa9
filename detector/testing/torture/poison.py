"""A corpus of bad input records: each must land on the DLQ exactly once, and nothing else break.

Every entry is (name, key, value). Keys are bytes or None; values are bytes or None. Records whose
only fault is an optional field are not poison (DESIGN §3): the worker keeps the event without
that field and counts the drop; they are listed apart, in `kept_with_a_dropped_field`. An
unknown field is ignored whatever it holds: none of these records is poison for one.
"""

from __future__ import annotations

import json
from typing import Any

Record = tuple[str, bytes | None, bytes | None]

_WF = "poison-wf"


def _event(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "event_id": "poison",
        "kind": "heartbeat",
        "workflow_key": _WF,
        "owner_epoch": 1,
        "worker_id": "w-poison",
        "seq": 1,
    }
    for name, value in changes.items():
        if value is _DROP:
            doc.pop(name, None)
        else:
            doc[name] = value
    return doc


_DROP = object()


def _json(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def corpus(largest_value: int) -> list[Record]:
    """At least 50 distinct bad records; `largest_value` is the biggest value the topic accepts."""
    key = _WF.encode()
    good = _json(_event())
    entries: list[Record] = [
        ("truncated_json", key, good[:-7]),
        ("truncated_to_brace", key, b"{"),
        ("invalid_utf8", key, b'{"event_id": "\xff\xfe", "kind": "heartbeat"}'),
        ("latin1_bytes", key, '{"event_id": "caf\xe9"}'.encode("latin-1")),
        ("empty_value", key, b""),
        ("null_value", key, None),
        ("null_key", None, good),
        ("key_mismatch", b"another-workflow", good),
        ("json_array", key, b"[1, 2, 3]"),
        ("json_string", key, b'"heartbeat"'),
        ("json_number", key, b"42"),
        ("json_null", key, b"null"),
        ("json_true", key, b"true"),
        ("trailing_garbage", key, good + b" garbage"),
        ("two_objects", key, good + good),
        ("nan_epoch", key, good.replace(b'"owner_epoch": 1', b'"owner_epoch": NaN')),
        ("whitespace_only", key, b"   \n  "),
        ("too_large_64k", key, _json(_event(detail={"pad": "x" * 70_000}))),
        ("largest_accepted", key, b"{" + b" " * (largest_value - 2) + b"}"),
        ("unknown_kind", key, _json(_event(kind="teleported"))),
        ("kind_number", key, _json(_event(kind=3))),
        ("kind_null", key, _json(_event(kind=None))),
        ("negative_epoch", key, _json(_event(owner_epoch=-1))),
        ("epoch_2_pow_64", key, _json(_event(owner_epoch=2**64))),
        ("epoch_2_pow_63", key, _json(_event(owner_epoch=2**63))),
        ("epoch_string", key, _json(_event(owner_epoch="17"))),
        ("epoch_float", key, _json(_event(owner_epoch=17.5))),
        ("epoch_bool", key, _json(_event(owner_epoch=True))),
        ("epoch_null", key, _json(_event(owner_epoch=None))),
        ("event_id_empty", key, _json(_event(event_id=""))),
        ("event_id_too_long", key, _json(_event(event_id="e" * 200))),
        ("event_id_number", key, _json(_event(event_id=5))),
        ("workflow_key_too_long", b"w" * 600, _json(_event(workflow_key="w" * 600))),
        ("worker_id_too_long", key, _json(_event(worker_id="w" * 300))),
        ("worker_id_null", key, _json(_event(worker_id=None))),
        ("attempt_without_effect_key", key, _json(_event(kind="effect_attempted"))),
        ("commit_without_effect_key", key, _json(_event(kind="effect_committed"))),
        ("verified_without_effect_key", key, _json(_event(kind="outcome_verified"))),
        ("effect_key_too_long", key, _json(_event(kind="effect_attempted", effect_key="k" * 600))),
        ("effect_key_empty", key, _json(_event(kind="effect_committed", effect_key=""))),
        ("rejected_effect_key_number", key, _json(_event(kind="effect_rejected", effect_key=5))),
        ("worker_id_empty", key, _json(_event(worker_id=""))),
        ("names_disagree_workflow_key", key, _json(_event(job="another-workflow"))),
        ("names_disagree_owner_epoch", key, _json(_event(token=2))),
        ("names_disagree_worker_id", key, _json(_event(owner_id="w-other"))),
        ("worker_id_lone_surrogate", key, _json(_event(worker_id="w-\ud800"))),
        ("epoch_nested_deep", key, _json(_event(owner_epoch=_nested(300)))),
        ("deep_detail_and_no_kind", key, _json(_event(kind=_DROP, detail=_nested(300)))),
        ("unreadable_seq_given_twice", key, good[:-1] + b', "seq": "\\udc00"}'),
    ]
    for missing in ("event_id", "kind", "workflow_key", "owner_epoch", "worker_id"):
        entries.append((f"missing_{missing}", key, _json(_event(**{missing: _DROP}))))
    return entries


def _nested(depth: int) -> Any:
    """A JSON value nested deeper than the JSON parser allows (200 levels)."""
    value: Any = {"leaf": 1}
    for _ in range(depth):
        value = {"n": value}
    return value


def kept_with_a_dropped_field() -> list[Record]:
    """Records with one invalid or unreadable optional field: never dead-lettered, processed
    without it."""
    key = _WF.encode()
    good = _json(_event())
    return [
        ("deeply_nested_detail", key, _json(_event(detail=_nested(300)))),
        ("detail_lone_surrogate", key, _json(_event(detail={"note": "\ud800"}))),
        ("detail_not_utf8", key, good[:-1] + b', "detail": {"note": "\xff"}}'),
        (
            "detail_number_out_of_range",
            key,
            good[:-1] + b', "detail": {"n": ' + b"9" * 4400 + b"}}",
        ),
        ("detail_name_twice", key, good[:-1] + b', "detail": {"n": 1, "n": 2}}'),
        ("attrs_name_twice", key, good[:-1] + b', "attrs": {"model": "a", "model": "b"}}'),
        ("attrs_lone_surrogate", key, _json(_event(attrs={"model": "\udc00"}))),
        ("destination_lone_surrogate", key, _json(_event(destination="\ud800"))),
        ("lease_duration_true", key, _json(_event(lease_duration_s=True))),
        ("lease_duration_string", key, _json(_event(lease_duration_s="30"))),
        ("heartbeat_interval_false", key, _json(_event(heartbeat_interval_s=False))),
        ("seq_true", key, _json(_event(seq=True))),
        ("seq_nested_deep", key, _json(_event(seq=_nested(300)))),
        ("detail_over_4k", key, _json(_event(detail={"blob": "y" * 5000}))),
        ("detail_not_object", key, _json(_event(detail=[1, 2]))),
        ("seq_negative", key, _json(_event(seq=-5))),
        ("seq_string", key, _json(_event(seq="5"))),
        ("seq_float", key, _json(_event(seq=5.5))),
        ("source_unknown", key, _json(_event(source="oracle"))),
        ("observed_at_naive", key, _json(_event(observed_at="2026-07-26T10:00:00"))),
        ("observed_at_garbage", key, _json(_event(observed_at="yesterday"))),
        ("lease_until_number", key, _json(_event(lease_until=12))),
        ("lease_duration_negative", key, _json(_event(lease_duration_s=-30))),
        ("heartbeat_interval_zero", key, _json(_event(heartbeat_interval_s=0))),
        ("attrs_not_strings", key, _json(_event(attrs={"tool_class": 7}))),
        ("attrs_too_many", key, _json(_event(attrs={f"k{i}": "v" for i in range(40)}))),
        ("attrs_long_value", key, _json(_event(attrs={"tool_class": "z" * 500}))),
        ("trace_id_not_hex", key, _json(_event(trace_id="zz" * 16))),
        ("span_id_short", key, _json(_event(span_id="abc"))),
    ]
