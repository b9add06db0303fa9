"""Job-queue log lines (DESIGN §3): read as written, and refused when they say one thing twice."""

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from detector.histories.logfmt import LogfmtError, parse_logfmt_line
from detector.histories.reader import BadLine, parse_line


def test_a_job_queue_line_becomes_an_event_mapping() -> None:
    line = 'job_claimed job=8f1b token=42 worker="w 1" seq=3 attrs.tool_class=browser detail.n=7'
    assert parse_logfmt_line(line) == (
        {
            "kind": "job_claimed",
            "job": "8f1b",
            "token": 42,
            "worker": "w 1",
            "seq": 3,
            "attrs": {"tool_class": "browser"},
            "detail": {"n": "7"},
        },
        (),
    )


def test_quoted_values_keep_escaped_quotes_and_may_be_empty() -> None:
    got, _ = parse_logfmt_line(r'progress note="said \"hi\"" empty=""')
    assert (got["note"], got["empty"]) == ('said "hi"', "")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("attrs=foo attrs.x=1", "attrs given both as attrs= and as attrs.X="),
        ("attrs.x=1 attrs=foo", "attrs given both"),
        ("detail=1 detail.x=2", "detail given both"),
        ("detail.x=2 detail=1", "detail given both"),
    ],
)
def test_an_object_given_whole_and_by_key_is_refused(line: str, says: str) -> None:
    with pytest.raises(LogfmtError, match=says):
        parse_logfmt_line(f"heartbeat job=a token=1 worker=w {line}")


@pytest.mark.parametrize(
    "line",
    [
        'heartbeat job=a worker="w1',
        'heartbeat job=a worker="w1 seq=3',
        'heartbeat job=a worker="w1\\"',
        'heartbeat job="',
    ],
)
def test_an_unterminated_quote_is_refused_not_cut(line: str) -> None:
    with pytest.raises(LogfmtError, match="unterminated quote"):
        parse_logfmt_line(line)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("progress kind=heartbeat job=a", "kind"),
        ("kind=heartbeat progress job=a", "kind"),
        ("heartbeat job=a job=b", "job"),
        ("heartbeat job=a seq=1 seq=2", "seq"),
    ],
)
def test_a_field_given_twice_with_different_values_is_refused_by_name(
    line: str, field: str
) -> None:
    with pytest.raises(LogfmtError, match=f"^{field} given twice with different values"):
        parse_logfmt_line(line)


@pytest.mark.parametrize(
    "line",
    [
        "progress kind=progress job=a",
        "job_claimed kind=lease_acquired job=a",  # an alias and its kind mean one thing
        "heartbeat job=a job=a seq=2 seq=2",
    ],
)
def test_a_field_given_twice_with_one_value_is_fine(line: str) -> None:
    assert parse_logfmt_line(line)[0]["job"] == "a"


def test_the_bare_kind_word_stays_the_kind() -> None:
    assert parse_logfmt_line("tool_request_started kind=effect_attempted")[0]["kind"] == (
        "tool_request_started"
    )


def test_two_bare_words_are_refused() -> None:
    with pytest.raises(LogfmtError, match="unexpected bare word"):
        parse_logfmt_line("heartbeat progress job=a")


def test_a_line_without_a_kind_is_refused() -> None:
    with pytest.raises(LogfmtError, match="no kind"):
        parse_logfmt_line("job=a token=1")


def test_a_long_conflicting_value_is_shortened_in_the_message() -> None:
    with pytest.raises(LogfmtError) as err:
        parse_logfmt_line(f"heartbeat job=a job={'x' * 5000}")
    assert len(str(err.value)) < 200


@pytest.mark.parametrize("group", ["attrs", "detail"])
def test_a_name_given_twice_inside_an_object_drops_the_object_not_the_line(group: str) -> None:
    """DESIGN §3: a name repeated inside `attrs` or `detail` costs that field; the event is
    kept. The same name with one value is no repetition that matters."""
    line = f"heartbeat job=a token=1 worker=w {group}.model=x {group}.model=y {group}.n=1"
    obj, dropped = parse_logfmt_line(line)
    assert group not in obj and obj["job"] == "a"
    assert [(d.field, d.reason) for d in dropped] == [
        (group, "model: given twice with different values")
    ]
    obj, dropped = parse_logfmt_line(f"heartbeat job=a {group}.model=x {group}.model=x")
    assert (obj[group], dropped) == ({"model": "x"}, ())


def test_lease_policy_numbers_are_numbers_and_a_word_is_not_one() -> None:
    obj, _ = parse_logfmt_line("job_claimed job=a lease_duration_s=30 heartbeat_interval_s=1.5e1")
    assert (obj["lease_duration_s"], obj["heartbeat_interval_s"]) == (30.0, 15.0)
    obj, _ = parse_logfmt_line("job_claimed job=a lease_duration_s=true heartbeat_interval_s=30s")
    assert (obj["lease_duration_s"], obj["heartbeat_interval_s"]) == ("true", "30s")


# ---- numbers as JSON writes them (DESIGN §3) --------------------------------------------------

NUMBER_FIELDS = (
    "owner_epoch",
    "token",
    "fencing_token",
    "seq",
    "lease_duration_s",
    "heartbeat_interval_s",
)
NOT_NUMBERS = (
    "\N{FULLWIDTH DIGIT TWO}",  # Python's int() reads it as 2
    "\N{ARABIC-INDIC DIGIT THREE}",
    "\N{SUPERSCRIPT TWO}",
    "1_000",
    " 1",
    "1 ",
    "+1",
    "007",
    "00",
    "-",
    "1.",
    ".5",
    "1e",
    "0x10",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "true",
    "",
    "4\N{FULLWIDTH DIGIT TWO}",
    "1.\N{FULLWIDTH DIGIT FIVE}",
    "1e\N{ARABIC-INDIC DIGIT THREE}",
)


@pytest.mark.parametrize("field", NUMBER_FIELDS)
@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_a_value_not_written_as_json_writes_a_number_stays_a_string(field: str, value: str) -> None:
    obj, _ = parse_logfmt_line(f"job_claimed job=a {field}={json.dumps(value, ensure_ascii=False)}")
    assert obj[field] == value


@pytest.mark.parametrize("field", NUMBER_FIELDS)
@pytest.mark.parametrize(
    ("value", "number"),
    [("0", 0), ("-0", 0), ("42", 42), ("-1", -1), ("1.0", 1.0), ("1e2", 100.0), ("-2.5E-1", -0.25)],
)
def test_a_json_number_is_read_as_json_reads_it(field: str, value: str, number: float) -> None:
    obj, _ = parse_logfmt_line(f"job_claimed job=a {field}={value}")
    assert obj[field] == number and type(obj[field]) is type(number)


def test_a_fullwidth_token_is_no_epoch_and_the_line_names_the_field() -> None:
    """`token=` and a fullwidth two was read as epoch 2: Python's int() takes any Unicode digit."""
    line = parse_line(
        3, "job_claimed job=8f1b token=\N{FULLWIDTH DIGIT TWO} worker=w1 seq=3".encode()
    )
    assert isinstance(line, BadLine)
    assert line.describe() == "line 3: token: Input should be a valid integer"


def test_a_fullwidth_seq_is_dropped_and_reported_like_any_invalid_optional_field() -> None:
    line = parse_line(
        1, "job_claimed job=8f1b token=42 worker=w1 seq=\N{FULLWIDTH DIGIT THREE}".encode()
    )
    assert not isinstance(line, BadLine)
    assert line.event.seq is None
    assert line.drops() == [
        "line 1: dropped seq: Input should be a valid integer (the event is kept)"
    ]


def _json_line(field: str, member: str) -> bytes:
    """The event as JSON, the numeric field's member written as it is."""
    epoch = "" if field in ("owner_epoch", "token", "fencing_token") else '"token": 1, '
    return (
        '{"event_id": "e1", "kind": "job_claimed", "job": "a", "worker": "w", '
        f'"source": "coordinator", {epoch}"{field}": {member}}}'
    ).encode()


def _logfmt_line(field: str, value: str) -> bytes:
    epoch = "" if field in ("owner_epoch", "token", "fencing_token") else "token=1 "
    written = (
        value
        if value and not any(c in value for c in ' "=\\')
        else json.dumps(value, ensure_ascii=False)
    )
    line = f"job_claimed event_id=e1 job=a worker=w source=coordinator {epoch}{field}={written}"
    return line.encode()


def _read(raw: bytes) -> Any:
    got = parse_line(1, raw)
    if isinstance(got, BadLine):
        return ("bad", got.error.field, got.error.reason)
    return ("good", got.event.model_dump(), got.event.dropped_fields)


def _reference_json_number(text: str) -> bool:
    """An independent reading of RFC 8259: the standard library's JSON scanner (ASCII digits
    only), with its non-standard NaN and Infinity refused and no whitespace around."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return text == text.strip() and type(value) in (int, float)


NUMBER_TEXT = st.text(
    alphabet="0123456789-+.eE _"
    + "\N{FULLWIDTH DIGIT TWO}\N{ARABIC-INDIC DIGIT THREE}\N{SUPERSCRIPT TWO}",
    max_size=8,
)


@given(field=st.sampled_from(NUMBER_FIELDS), value=NUMBER_TEXT)
@example(field="token", value="\N{FULLWIDTH DIGIT TWO}")
@example(field="seq", value="\N{ARABIC-INDIC DIGIT THREE}")
@example(field="lease_duration_s", value="1e400")
@example(field="seq", value="99999999999999999999")
@example(field="heartbeat_interval_s", value="1.5e1")
@example(field="owner_epoch", value="1.0")
@example(field="fencing_token", value="1e2")
@example(field="seq", value="-0")
@example(field="owner_epoch", value="NaN")
@example(field="seq", value="Infinity")
def test_a_logfmt_number_field_reads_as_the_same_json_event(field: str, value: str) -> None:
    """DESIGN §3: a logfmt number is one only when JSON would write it so, and then it is read
    exactly as JSON reads it (an epoch of `1.0` or `1e2` is refused on both paths, a lease of
    `1e2` is 100 on both). A value that is no JSON number is a string on the line, and reads as
    the JSON string would: the epoch costs the line, an optional field is dropped, each named."""
    member = value if _reference_json_number(value) else json.dumps(value, ensure_ascii=False)
    assert _read(_logfmt_line(field, value)) == _read(_json_line(field, member))
