"""Job-queue log lines (DESIGN §3): read as written, and refused when they say one thing twice."""

import pytest

from detector.histories.logfmt import LogfmtError, parse_logfmt_line


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
