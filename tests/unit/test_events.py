"""The input contract at the edge: aliases fold in, limits hold, errors name the field."""

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.contracts.events import (
    OPTIONAL_FIELDS,
    EventError,
    Kind,
    OwnershipEvent,
    parse_event_json,
    parse_event_obj,
)

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
        ({"workflow_key": None}, "workflow_key"),
        ({"worker_id": ""}, "worker_id"),
        ({"event_id": "x" * 129}, "event_id"),
    ],
)
def test_a_bad_required_field_rejects_the_event_and_names_the_field(
    changes: dict[str, object], field: str
) -> None:
    with pytest.raises(EventError) as err:
        parse_event_json(raw(**changes))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"seq": -3}, "seq"),
        ({"seq": "5"}, "seq"),
        ({"source": "oracle"}, "source"),
        ({"observed_at": "2026-07-26T10:00:00"}, "observed_at"),  # no UTC offset
        ({"observed_at": 1785000000}, "observed_at"),
        ({"lease_until": "tomorrow"}, "lease_until"),
        ({"lease_duration_s": 0}, "lease_duration_s"),
        ({"heartbeat_interval_s": -1}, "heartbeat_interval_s"),
        ({"attrs": {"tool_class": "x" * 200}}, "attrs"),
        ({"attrs": {"tool_class": 7}}, "attrs"),
        ({"attrs": "browser"}, "attrs"),
        ({"detail": {"blob": "x" * 5000}}, "detail"),
        ({"detail": [1, 2]}, "detail"),
        ({"destination": "d" * 300}, "destination"),
        ({"trace_id": "4BF92F3577B34DA6A3CE929D0E0E4736"}, "trace_id"),
        ({"span_id": "not-hex"}, "span_id"),
        ({"effect_key": ""}, "effect_key"),  # a heartbeat needs no effect key
    ],
)
def test_a_bad_optional_field_is_dropped_and_the_event_kept(
    changes: dict[str, object], field: str
) -> None:
    event = parse_event_json(raw(**{"seq": 4, "observed_at": "2026-07-26T10:00:00Z", **changes}))
    assert (event.event_id, event.workflow_key, event.owner_epoch) == ("e1", "wf", 3)
    assert [d.field for d in event.dropped_fields] == [field]
    assert event.dropped_fields[0].reason  # says why, for the report and the log
    assert getattr(event, field) == OwnershipEvent.model_fields[field].default
    kept = {"seq": 4, "observed_at": datetime(2026, 7, 26, 10, tzinfo=UTC)}
    for name, value in kept.items():
        if name != field:
            assert getattr(event, name) == value  # only the bad field goes


def test_every_bad_optional_field_is_reported_once() -> None:
    event = parse_event_json(
        raw(observed_at="2026-07-26 10:00", trace_id="XYZ", attrs={"a": 1, "b": 2})
    )
    assert sorted(d.field for d in event.dropped_fields) == ["attrs", "observed_at", "trace_id"]


def test_a_valid_event_drops_nothing() -> None:
    assert parse_event_json(raw(seq=1, attrs={"tool_class": "browser"})).dropped_fields == ()


def test_a_bad_required_field_wins_over_bad_optional_ones() -> None:
    with pytest.raises(EventError) as err:
        parse_event_json(raw(observed_at="noon", owner_epoch=-1))
    assert err.value.field == "owner_epoch"


@pytest.mark.parametrize("kind", ["effect_attempted", "effect_committed", "outcome_verified"])
def test_effect_kinds_need_an_effect_key(kind: str) -> None:
    with pytest.raises(EventError, match="effect_key: required for kind") as err:
        parse_event_json(raw(kind=kind))
    assert err.value.field == "effect_key"


@pytest.mark.parametrize("kind", ["effect_committed", "effect_rejected", "result_rejected"])
def test_an_invalid_effect_key_rejects_an_effect_kind(kind: str) -> None:
    """Where the kind needs the key it is required: never replaced by a default such as
    `result`, which would merge unrelated effects."""
    with pytest.raises(EventError) as err:
        parse_event_json(raw(kind=kind, effect_key="k" * 513, observed_at="bad"))
    assert err.value.field == "effect_key"


def test_tool_request_started_takes_its_request_as_the_effect_key() -> None:
    event = parse_event_obj({**BASE, "kind": "tool_request_started", "request": "ext-791"})
    assert (event.kind, event.effect_key) == (Kind.EFFECT_ATTEMPTED, "ext-791")
    assert event.dropped_fields == ()


def test_tool_request_started_without_a_request_names_the_tool_request() -> None:
    assert parse_event_json(raw(kind="tool_request_started")).effect_key == "tool_request"


def test_tool_request_started_keeps_an_explicit_effect_key() -> None:
    event = parse_event_json(raw(kind="tool_request_started", effect_key="k", request="r"))
    assert event.effect_key == "k"


def test_an_unusable_request_is_a_dropped_field() -> None:
    event = parse_event_json(raw(kind="tool_request_started", request=791))
    assert event.effect_key == "tool_request"
    assert [d.field for d in event.dropped_fields] == ["request"]


def test_effect_attempted_does_not_borrow_a_request_field() -> None:
    with pytest.raises(EventError, match="effect_key"):
        parse_event_json(raw(kind="effect_attempted", request="ext-791"))


# DESIGN §3: the job-queue names of the required fields.
ALIASES = {
    "workflow_key": ("workflow_key", "job"),
    "owner_epoch": ("owner_epoch", "token", "fencing_token"),
    "worker_id": ("worker_id", "worker", "owner_id"),
}


@pytest.mark.parametrize(
    ("names", "field"),
    [
        ({"workflow_key": "a", "job": "b"}, "workflow_key"),
        ({"owner_epoch": 3, "token": 4}, "owner_epoch"),
        ({"token": 3, "fencing_token": 4}, "owner_epoch"),
        ({"owner_epoch": 3, "fencing_token": True}, "owner_epoch"),
        ({"worker_id": "w1", "worker": "w2"}, "worker_id"),
        ({"worker": "w1", "owner_id": "w2"}, "worker_id"),
    ],
)
def test_one_field_under_two_names_with_different_values_is_refused(
    names: dict[str, object], field: str
) -> None:
    doc = dict(BASE)
    for canonical, all_names in ALIASES.items():
        if any(n in names for n in all_names):
            doc.pop(canonical)
    doc |= names
    with pytest.raises(EventError, match="given twice with different values") as err:
        parse_event_json(json.dumps(doc))
    assert err.value.field == field
    with pytest.raises(EventError, match="given twice with different values") as err:
        parse_event_obj(doc)  # logfmt lines and emitter calls
    assert err.value.field == field


def test_one_field_under_two_names_with_one_value_is_fine() -> None:
    doc = {**BASE, "job": "wf", "token": 3, "fencing_token": 3, "worker": "w1", "owner_id": None}
    event = parse_event_json(json.dumps(doc))
    assert (event.workflow_key, event.owner_epoch, event.worker_id) == ("wf", 3, "w1")
    assert "job" not in event.model_dump() and "job_queue_name" not in event.model_dump()


# One JSON text, one name written twice: json.dumps cannot write that, so these are literal.
_HEAD = '{"event_id": "e1", "kind": "heartbeat", "workflow_key": "wf", "worker_id": "w1"'


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (_HEAD + ', "owner_epoch": 17, "owner_epoch": 18}', "owner_epoch"),
        (_HEAD + ', "owner_epoch": 17, "seq": 4, "seq": 40}', "seq"),
        (_HEAD + ', "owner_epoch": 17, "seq": 4, "seq": 4.0}', "seq"),  # int against float
        (_HEAD + ', "owner_epoch": 17, "kind": "lease_acquired"}', "kind"),
        (_HEAD + ', "owner_epoch": 17, "\\u006bind": "lease_acquired"}', "kind"),  # an escape
        (_HEAD + ', "owner_epoch": 17, "seq": null, "seq": 4}', "seq"),
        (_HEAD + ', "owner_epoch": 17, "attrs": {"model": "a"}, "attrs": {"model": "b"}}', "attrs"),
        (
            _HEAD + ', "owner_epoch": 1, "detail": {"n": {"m": [{"x": 1}]}}, "owner_epoch": 2}',
            "owner_epoch",
        ),
        # with an invalid optional field too (the slow path that drops it)
        (_HEAD + ', "owner_epoch": 1, "owner_epoch": 2, "span_id": "zz"}', "owner_epoch"),
        # a job queue's names
        (_HEAD.replace('"workflow_key"', '"job"') + ', "token": 1, "job": "wf2"}', "job"),
    ],
)
def test_one_name_written_twice_with_different_values_is_refused(text: str, field: str) -> None:
    """JSON parsers keep the last value silently: a zombie's epoch written twice would pass as
    its successor's (DESIGN §3: a bad line, never a silent choice)."""
    for doc in (text, text.encode()):
        with pytest.raises(EventError, match="given twice with different values") as err:
            parse_event_json(doc)
        assert err.value.field == field


@pytest.mark.parametrize(
    "text",
    [
        _HEAD + ', "owner_epoch": 17, "owner_epoch": 17}',
        _HEAD + ', "owner_epoch": 17, "detail": {"a": 1, "b": 2}, "detail": {"b": 2, "a": 1}}',
        _HEAD + ', "owner_epoch": 17, "not_a_field": 1, "not_a_field": 2}',  # ignored anyway
        _HEAD + ', "owner_epoch": 17, "detail": {"n": {"m": [{"x": 1}, {"y": [2]}]}, "k": 1}}',
        '{"event_id": "e1", "kind": "heartbeat", "workflow_key": "wf", "owner_epoch": 17, '
        '"worker_id": "\\"kind\\": \\"seq\\"", "detail": {"kind": "x", "seq": 1}}',
    ],
)
def test_a_name_written_twice_with_one_value_or_only_inside_values_is_fine(text: str) -> None:
    event = parse_event_json(text)
    assert (event.workflow_key, event.owner_epoch, event.kind.value) == ("wf", 17, "heartbeat")


def test_truncated_json_is_an_event_error() -> None:
    with pytest.raises(EventError):
        parse_event_json(raw()[:-5])


@pytest.mark.parametrize("doc", [b"[1, 2]", b"42", b'"event"', b"{}"])
def test_json_that_is_not_an_event_object_is_an_event_error(doc: bytes) -> None:
    with pytest.raises(EventError):
        parse_event_json(doc)


# ---- DESIGN §3: whatever makes an optional or unknown part unreadable never costs the event --

# JSON that the parser cannot read although it is JSON, as the text of one value: nesting
# deeper than it allows, an unpaired surrogate (high, low), bytes that are not UTF-8, a number
# out of its range.
UNREADABLE: dict[str, bytes] = {
    "nested 300 deep": b'{"n":' * 300 + b"1" + b"}" * 300,
    "a list nested 3000 deep": b"[" * 3000 + b"]" * 3000,
    "a high surrogate alone": b'"a\\ud800"',
    "a low surrogate alone": b'{"note": "\\udc00b"}',
    "a surrogate alone in a name": b'{"\\ud800": 1}',
    "bytes that are not UTF-8": b'{"note": "\xff\xfe"}',
    "a number of 4400 digits": b"9" * 4400,
}
_TEXT = json.dumps(BASE).encode()


def with_member(name: str, value: bytes, text: bytes = _TEXT) -> bytes:
    """The JSON object `text` with one more member, written as it is."""
    return text[:-1] + b', "' + name.encode() + b'": ' + value + b"}"


@pytest.mark.parametrize("unreadable", UNREADABLE.values(), ids=UNREADABLE.keys())
@pytest.mark.parametrize("field", [f for f in OPTIONAL_FIELDS if f != "effect_key"])
def test_an_unreadable_optional_field_is_dropped_and_reported(
    field: str, unreadable: bytes
) -> None:
    witness = "span_id" if field == "observed_at" else "observed_at"  # a valid field stays
    valid = {"observed_at": "2026-07-26T10:00:00Z", "span_id": "00f067aa0ba902b7"}[witness]
    text = with_member(field, unreadable, raw(**{witness: valid}))
    event = parse_event_json(text)
    assert (event.event_id, event.workflow_key, event.owner_epoch) == ("e1", "wf", 3)
    assert witness in event.model_dump(exclude_unset=True)
    (drop,) = event.dropped_fields
    assert drop.field == field and drop.reason.startswith("unreadable JSON: ")
    assert parse_event_json(text.decode("utf-8", "replace")).event_id == "e1"  # as a str too


@pytest.mark.parametrize("unreadable", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_an_unknown_field_is_ignored_whatever_it_holds(unreadable: bytes) -> None:
    event = parse_event_json(with_member("shiny_new_field", unreadable))
    assert (event.event_id, event.dropped_fields) == ("e1", ())
    twice = with_member("x", unreadable, with_member("x", b"1"))  # a repeat there changes nothing
    assert parse_event_json(twice).dropped_fields == ()
    for name in ("\\ud800x", "\\udc00"):  # a name that cannot be read is no field's
        assert parse_event_json(with_member(name, unreadable)).dropped_fields == ()


@pytest.mark.parametrize("unreadable", UNREADABLE.values(), ids=UNREADABLE.keys())
@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("event_id", "event_id"),
        ("kind", "kind"),
        ("worker_id", "worker_id"),
        ("owner_epoch", "owner_epoch"),
        ("token", "owner_epoch"),
        ("job", "workflow_key"),
    ],
)
def test_an_unreadable_required_field_costs_the_event(
    name: str, field: str, unreadable: bytes
) -> None:
    doc = {k: v for k, v in BASE.items() if k != field}
    with pytest.raises(EventError) as err:
        parse_event_json(with_member(name, unreadable, json.dumps(doc).encode()))
    assert err.value.field == field


@pytest.mark.parametrize("kind", ["effect_committed", "effect_rejected", "outcome_verified"])
def test_an_unreadable_effect_key_costs_an_effect_kind_and_is_dropped_elsewhere(kind: str) -> None:
    unreadable = UNREADABLE["a high surrogate alone"]
    with pytest.raises(EventError) as err:
        parse_event_json(with_member("effect_key", unreadable, raw(kind=kind)))
    assert err.value.field == "effect_key"
    event = parse_event_json(with_member("effect_key", unreadable))
    assert [d.field for d in event.dropped_fields] == ["effect_key"]


def test_a_field_given_twice_and_unreadable_once_is_malformed() -> None:
    """Which of the two values counts would be a silent choice (DESIGN §3)."""
    for name, readable in (("owner_epoch", b"3"), ("seq", b"4"), ("detail", b"{}")):
        for unreadable in UNREADABLE.values():
            text = with_member(name, unreadable, with_member(name, readable, _TEXT))
            with pytest.raises(EventError, match="given twice with different values"):
                parse_event_json(text)


def test_a_text_that_is_not_json_stays_a_bad_line_whatever_else_it_holds() -> None:
    deep = UNREADABLE["nested 300 deep"]
    for broken in (
        *(b"[1,]", b'{"a" 1}', b"[1 2]", b"01", b'"\\x"', b"tru", b"{,}", b"[}", b'{"a":}'),
        *(b'["a": 1]', b'{"a": "b": 1}', b'{"a": 1 "b": 2}', b"{[]}", b'{"a": 1,}', b":"),
    ):
        with pytest.raises(EventError, match="Invalid JSON"):
            parse_event_json(with_member("detail", deep, with_member("x", broken)))
    with pytest.raises(EventError, match="Invalid JSON"):
        parse_event_json(with_member("detail", deep)[:-1])  # unterminated
    with pytest.raises(EventError, match="Invalid JSON"):
        parse_event_json(with_member("detail", deep) + b" {}")  # more after the object


@pytest.mark.parametrize("field", ["lease_duration_s", "heartbeat_interval_s", "seq"])
@pytest.mark.parametrize("value", [True, False, "30", 1e999, [30], {"s": 30}])
def test_a_boolean_or_a_string_is_not_a_number(field: str, value: object) -> None:
    """`true` is not a number (DESIGN §3), nor is "30"; infinity is no duration. Each numeric
    optional field is dropped, never read as 1.0, 30.0 or inf."""
    event = parse_event_json(raw(**{field: value}))
    assert [d.field for d in event.dropped_fields] == [field]
    assert getattr(event, field) is None


def test_numbers_are_still_numbers() -> None:
    event = parse_event_json(raw(seq=0, lease_duration_s=30, heartbeat_interval_s=7.5))
    assert (event.seq, event.lease_duration_s, event.heartbeat_interval_s) == (0, 30.0, 7.5)
    assert event.dropped_fields == ()


@pytest.mark.parametrize("value", [True, False, 3.0, "3", None])
def test_a_required_number_of_another_type_costs_the_event(value: object) -> None:
    with pytest.raises(EventError) as err:
        parse_event_json(raw(owner_epoch=value))
    assert err.value.field == "owner_epoch"


@pytest.mark.parametrize(
    ("field", "inside", "where"),
    [
        ("attrs", b'{"model": "a", "model": "b"}', "model"),
        ("attrs", b'{"model": "a", "tool_class": "x", "model": "c"}', "model"),
        ("detail", b'{"rows": 1, "rows": 2}', "rows"),
        ("detail", b'{"rows": 1, "rows": 1.0}', "rows"),  # one is not 1.0
        ("detail", b'{"a": {"b": [{"c": 1, "c": 2}]}}', "a.b.0.c"),
        ("detail", b'{"a": {"b": 1, "b": {"x": 1}}}', "a.b"),
    ],
)
def test_a_name_given_twice_inside_attrs_or_detail_drops_that_field(
    field: str, inside: bytes, where: str
) -> None:
    """DESIGN §3: a name repeated inside `attrs` or `detail` is unreadable, never one of its
    values chosen silently. The event is kept without the field, which is reported."""
    for text in (with_member(field, inside), with_member(field, inside).replace(b" ", b"")):
        event = parse_event_json(text)
        assert getattr(event, field) is None and event.event_id == "e1"
        assert [(d.field, d.reason) for d in event.dropped_fields] == [
            (field, f"{where}: given twice with different values")
        ]
        assert field not in event.model_dump(exclude_unset=True)


def test_a_name_given_twice_inside_attrs_or_detail_with_one_value_is_kept() -> None:
    event = parse_event_json(
        with_member("detail", b'{"a": [1, {"b": 2}], "a": [1, {"b": 2}]}', with_member("x", b"{}"))
    )
    assert (event.detail, event.dropped_fields) == ({"a": [1, {"b": 2}]}, ())


def test_drops_of_every_kind_are_reported_together() -> None:
    text = with_member("detail", UNREADABLE["nested 300 deep"], raw(lease_duration_s=True))
    text = with_member("attrs", b'{"m": "a", "m": "b"}', text)
    event = parse_event_json(text)
    assert sorted(d.field for d in event.dropped_fields) == [
        "attrs",
        "detail",
        "lease_duration_s",
    ]


@settings(max_examples=80, deadline=None)
@given(
    depth=st.one_of(st.integers(1, 150), st.integers(250, 3000)),  # the parser stops at 200
    where=st.sampled_from(["detail", "attrs", "destination", "unknown"]),
    leaf=st.sampled_from(['"\\ud800"', '"\\udfff"', "1", '"x"', "true", "null", "1e999"]),
    list_of=st.booleans(),
)
def test_any_depth_and_any_leaf_in_an_optional_or_unknown_part_keeps_the_event(
    depth: int, where: str, leaf: str, list_of: bool
) -> None:
    opening, closing = ("[", "]") if list_of else ('{"n": ', "}")
    value = (opening * depth + leaf + closing * depth).encode()
    event = parse_event_json(with_member(where, value))
    assert (event.event_id, event.owner_epoch) == ("e1", 3)
    readable = depth <= 150 and "\\u" not in leaf
    valid = where == "unknown" or (where == "detail" and readable and not list_of)
    assert [d.field for d in event.dropped_fields] == ([] if valid else [where])


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(
    extra=_JSON,
    spaced=st.booleans(),
    cut=st.integers(min_value=0),
    insert=st.sampled_from([b"", *(bytes([c]) for c in b'{}[],:"0 \\')]),
)
def test_only_json_is_read_member_by_member(
    extra: object, spaced: bool, cut: int, insert: bytes
) -> None:
    """An event with an unreadable unknown member is read member by member; the same text with
    one byte left out or put in is read only if it is still a JSON object (never a guess)."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps({**BASE, "extra": extra, "x": "\ud800"}, separators=separators).encode()
    assert parse_event_json(text).dropped_fields == ()
    at = cut % len(text)
    mutated = text[:at] + insert + text[at + bool(not insert) :]
    try:
        document = json.loads(mutated)
    except ValueError:
        document = None
    if isinstance(document, dict):  # read as the JSON object it is, or refused as it would be
        assert outcome(lambda: parse_event_json(mutated)) == outcome(
            lambda: parse_event_obj(document)
        )
    else:
        with pytest.raises(EventError):
            parse_event_json(mutated)


def outcome(read: Callable[[], OwnershipEvent]) -> OwnershipEvent | str:
    """The event read, or what refused it."""
    try:
        return read()
    except EventError as exc:
        return str(exc)


@pytest.mark.parametrize("own", ["ef" * 16, "XYZ"])  # a valid trace id, and one dropped
def test_a_records_trace_context_is_the_events_own(own: str) -> None:
    trace = ("ab" * 16, "cd" * 8)
    event = parse_event_json(raw(trace_id=own), trace)
    assert (event.trace_id, event.span_id) == trace
    # Set like any field read from the text: written out and read back, it is the same event.
    assert parse_event_json(event.model_dump_json(exclude_unset=True)) == event
