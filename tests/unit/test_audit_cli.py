"""`splitbrain audit` as a user meets it: exit codes, reports, bad lines, --expect."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detector.cli import main
from detector.cli.audit import _one_to_one
from detector.histories.audit import audit_lines
from tests.paths import ROOT, SEED_EXPECTED, SEED_FIXTURE

FIXTURE, EXPECTED = SEED_FIXTURE, SEED_EXPECTED


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_published_fixture_passes_its_expectation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = audit(capsys, str(FIXTURE), "--expect", str(EXPECTED))
    assert (code, out.strip().splitlines()[-1]) == (0, "PASS")


def test_expectation_failure_lists_differences(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    wrong = json.loads(EXPECTED.read_text())
    wrong["findings"][0]["severity"] = "warning"
    wrong["clean"].append("export-ledger")
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(wrong))
    code, out, _ = audit(capsys, str(FIXTURE), "--expect", str(path))
    assert code == 1
    assert out.strip().splitlines()[-1] == "FAIL"
    assert "severity critical, expected warning" in out
    assert "export-ledger: expected clean" in out


def test_json_format_prints_final_revision_per_finding(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = audit(capsys, str(FIXTURE), "--format", "json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 1  # a critical finding reaches the default --fail-on warning
    assert len(lines) == 1
    finding = lines[0]
    assert finding["schema"] == "splitbrain.finding/v1"
    assert finding["revision"] == 4
    assert [(c["kind"], c["seq"]) for c in finding["conditions"]] == [
        ("stale_activity", 6),
        ("stale_effect_attempt", 7),
        ("stale_effect_committed", 8),
        ("duplicate_effect", 9),
    ]


def test_text_report_gives_witness_and_response(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = audit(capsys, str(FIXTURE))
    assert "CRITICAL export-ledger" in out
    assert "witness: worker-alpha lost epoch 17 to a takeover at seq 5 (e05)" in out
    assert "response:" in out
    assert "clean (2): checkout-sync, report-index" in out
    assert out.startswith(
        "splitbrain audit: 16 events, 3 workflows, 1 finding (1 critical), 0 lines"
    )


@pytest.mark.parametrize(("fail_on", "code"), [("critical", 1), ("none", 0), ("info", 1)])
def test_fail_on_threshold(capsys: pytest.CaptureFixture[str], fail_on: str, code: int) -> None:
    assert audit(capsys, str(FIXTURE), "--fail-on", fail_on)[0] == code


def test_warning_only_history_passes_fail_on_critical(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(ROOT / "examples" / "job-queue.log")
    assert audit(capsys, log, "--fail-on", "critical")[0] == 0
    assert audit(capsys, log)[0] == 1


def test_bad_lines_are_reported_and_skipped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = tmp_path / "h.jsonl"
    good = FIXTURE.read_text().splitlines()
    history.write_text("\n".join([*good[:3], '{"event_id": "x"', "job_claimed job=", *good[3:]]))
    code, out, err = audit(capsys, str(history), "--format", "json")
    assert code == 1
    assert "line 4:" in err and "line 5:" in err
    assert "line 5: job: String should have at least 1 character" in err  # names the field
    assert len(out.splitlines()) == 1  # the finding survived the bad lines


def test_strict_stops_at_first_bad_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    history = tmp_path / "h.jsonl"
    history.write_text(FIXTURE.read_text() + "\nnot=an event\n")
    code, out, err = audit(capsys, str(history), "--strict")
    assert code == 2
    assert "line 18" in err
    assert out == ""


def test_invalid_utf8_line_is_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    history = tmp_path / "h.log"
    history.write_bytes(
        b"job_claimed job=a token=1 worker=\xff\xfe seq=1\n"
        b"job_claimed job=a token=1 worker=w seq=2\n"
    )
    code, _, err = audit(capsys, str(history))
    assert code == 0
    assert "line 1: worker_id: not UTF-8" in err


def test_bytes_that_are_not_utf8_cost_a_logfmt_line_only_in_a_required_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As in a JSON line (DESIGN §3): in an optional field they drop it, in an unknown one or a
    name they change nothing; what is printed escapes them."""
    history = tmp_path / "h.log"
    history.write_bytes(
        b"job_claimed job=a token=1 worker=w seq=1\n"
        b"job_claimed job=a token=2 worker=v seq=2\n"
        b"tool_request_started job=a token=1 worker=w seq=3 request=r detail.note=\xff "
        b"note\xfe=x attrs.model=\xfe\n"
    )
    code, out, err = audit(capsys, str(history))
    assert code == 1 and "stale_effect_attempt" in out
    assert err.splitlines() == [
        "line 3: dropped detail: not UTF-8 (the event is kept)",
        "line 3: dropped attrs: not UTF-8 (the event is kept)",
    ]


def test_empty_file_has_no_findings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, out, _ = audit(capsys, str(empty), "--format", "json")
    assert (code, out) == (0, "")


def test_missing_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = audit(capsys, "/nonexistent/history.jsonl")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "/nonexistent/history.jsonl" in err


def test_reads_standard_input_through_the_console_script() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "detector.cli", "audit", "-", "--format", "json"],
        input=FIXTURE.read_bytes(),
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["workflow_key"] == "export-ledger"


def test_logfmt_job_queue_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = audit(capsys, str(ROOT / "examples" / "job-queue.log"), "--format", "json")
    finding = json.loads(out)
    assert code == 1
    assert finding["workflow_key"] == "8f1b"
    assert (finding["displaced"]["owner_epoch"], finding["current"]["owner_epoch"]) == (42, 43)
    assert finding["sink_outcome"] == "rejected"


# ---- an invalid optional field never costs the event (DESIGN §3) -------------------------------

STALE_COMMIT = [  # epoch 17 displaced at seq 5, then its commit confirmed by a destination
    line
    for line in FIXTURE.read_text().splitlines()
    if json.loads(line)["event_id"] in {"e01", "e05", "e08"}
]


def with_fields(line: str, **fields: object) -> str:
    return json.dumps({**json.loads(line), **fields})


@pytest.mark.parametrize(
    "bad",
    [
        {"observed_at": "2026-07-26T10:00:24"},  # no UTC offset
        {"trace_id": "4BF92F3577B34DA6A3CE929D0E0E4736"},  # upper case
        {"span_id": "00f067aa0ba902b7ff"},
        {"attrs": {"tool_class": "x" * 500}},
        {"attrs": {"rows": 600}},
        {"detail": {"payload": "x" * 5000}},
        {"destination": "d" * 1000},
        {"lease_until": "soon"},
        {"lease_duration_s": 0},
        {"heartbeat_interval_s": "30s"},
    ],
)
def test_a_stale_commit_with_a_bad_optional_field_is_still_critical(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad: dict[str, object]
) -> None:
    history = tmp_path / "h.jsonl"
    history.write_text("\n".join([*STALE_COMMIT[:2], with_fields(STALE_COMMIT[2], **bad)]))
    code, out, err = audit(capsys, str(history), "--format", "json", "--fail-on", "critical")
    assert code == 1
    finding = json.loads(out)
    assert (finding["severity"], finding["sink_outcome"]) == ("critical", "committed")
    (field,) = bad
    (line,) = err.splitlines()
    assert line.startswith(f"line 3: dropped {field}: ") and line.endswith("(the event is kept)")


def test_an_invalid_source_falls_back_to_worker_and_is_reported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = tmp_path / "h.jsonl"
    history.write_text("\n".join([*STALE_COMMIT[:2], with_fields(STALE_COMMIT[2], source="db")]))
    code, out, err = audit(capsys, str(history), "--strict")  # a dropped field is no bad line
    assert code == 1  # a worker's claim of a stale commit is still a finding
    assert "line 3: dropped source: " in err
    assert ", 1 field dropped, " in out.splitlines()[0]


@pytest.mark.parametrize("seq", [-8, True, "8", 8.5])
def test_an_invalid_seq_is_dropped_and_the_event_ordered_by_arrival(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, seq: object
) -> None:
    """`seq` is optional (DESIGN §3): a bad one, `true` included, is dropped, never fatal."""
    history = tmp_path / "h.jsonl"
    history.write_text("\n".join([*STALE_COMMIT[:2], with_fields(STALE_COMMIT[2], seq=seq)]))
    code, out, err = audit(capsys, str(history), "--format", "json")
    assert code == 1
    (condition,) = json.loads(out)["conditions"]
    assert (condition["kind"], condition["seq"]) == ("stale_effect_committed", None)
    assert "line 3: dropped seq: " in err


def test_drops_are_counted_in_the_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = tmp_path / "h.jsonl"
    lines = FIXTURE.read_text().splitlines()
    lines[0] = with_fields(lines[0], observed_at="yesterday", lease_duration_s=-90)
    lines[5] = with_fields(lines[5], trace_id="XYZ")
    history.write_text("\n".join(lines))
    code, out, err = audit(capsys, str(history))
    assert code == 1
    assert ", 0 lines skipped, 3 fields dropped, " in out.splitlines()[0]
    assert [line.split(":")[0] for line in err.splitlines()] == ["line 1", "line 1", "line 6"]


def with_member(line: str, name: str, value: str) -> str:
    """`line` with one more member written as it is (JSON that `json.dumps` would not write)."""
    return f'{line.rstrip()[:-1]}, "{name}": {value}}}'


DEEP = '{"n": ' * 300 + "1" + "}" * 300  # deeper than the JSON parser allows


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("detail", DEEP, "detail: unreadable JSON: recursion limit exceeded"),
        ("detail", '{"note": "\\ud800"}', "detail: unreadable JSON: "),
        ("attrs", '{"tool_class": "\\udc00"}', "attrs: unreadable JSON: "),
        ("detail", '{"rows": 1, "rows": 2}', "detail: rows: given twice with different values"),
        (
            "attrs",
            '{"model": "a", "model": "b"}',
            "attrs: model: given twice with different values",
        ),
        ("lease_duration_s", "true", "lease_duration_s: Input should be a valid number"),
        ("unknown_field", DEEP, None),
        ("unknown_field", '["\\ud800", ' + "9" * 4400 + "]", None),
    ],
)
def test_a_stale_commit_with_an_unreadable_optional_or_unknown_part_is_still_critical(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, value: str, says: str | None
) -> None:
    """DESIGN §3: whatever makes an optional or unknown part unreadable, the event is kept when
    its required fields can be read; an optional field's drop is reported on stderr, naming the
    line and the field, an unknown field is ignored. Here the kept event is the stale commit."""
    history = tmp_path / "h.jsonl"
    history.write_text("\n".join([*STALE_COMMIT[:2], with_member(STALE_COMMIT[2], name, value)]))
    code, out, err = audit(capsys, str(history), "--format", "json", "--fail-on", "critical")
    assert code == 1
    finding = json.loads(out)
    assert (finding["severity"], finding["sink_outcome"]) == ("critical", "committed")
    assert [c["kind"] for c in finding["conditions"]] == ["stale_effect_committed"]
    if says is None:
        assert err == ""
    else:
        (line,) = err.splitlines()
        assert line.startswith(f"line 3: dropped {says}") and line.endswith("(the event is kept)")


def test_a_boolean_lease_duration_drives_no_lease_policy_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`true` is not a number: read as 1.0 it made a 15 s heartbeat look like a broken policy."""
    acquired = json.loads(STALE_COMMIT[0])
    history = tmp_path / "h.jsonl"
    history.write_text(
        json.dumps({**acquired, "lease_duration_s": True, "heartbeat_interval_s": 15})
    )
    code, out, err = audit(capsys, str(history))
    assert code == 0 and "lease warning" not in out
    assert err.startswith("line 1: dropped lease_duration_s: ")
    history.write_text(json.dumps({**acquired, "lease_duration_s": 1, "heartbeat_interval_s": 15}))
    _, out, _ = audit(capsys, str(history))
    assert "lease warning" in out  # the same policy with a number is warned about


def test_a_name_given_twice_inside_attrs_in_a_job_queue_log_drops_attrs_not_the_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "jobs.log"
    log.write_text(
        "job_claimed job=9a2c token=7 worker=w1 seq=1\n"
        "job_claimed job=9a2c token=8 worker=w2 seq=2\n"
        "tool_request_started job=9a2c token=7 worker=w1 seq=3 request=r "
        "attrs.model=a attrs.model=b\n"
    )
    code, out, err = audit(capsys, str(log), "--format", "json")
    assert code == 1 and json.loads(out)["conditions"][0]["kind"] == "stale_effect_attempt"
    assert (
        err
        == "line 3: dropped attrs: model: given twice with different values (the event is kept)\n"
    )


# ---- the job-queue vocabulary ----------------------------------------------------------------


def test_a_stale_tool_request_in_a_job_queue_log_is_found_under_its_request_id(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "jobs.log"
    log.write_text(
        "job_claimed job=9a2c token=7 worker=w1 seq=1\n"
        "job_claimed job=9a2c token=8 worker=w2 seq=2\n"
        "tool_request_started job=9a2c token=7 worker=w1 seq=3 request=ext-791\n"
        "tool_request_started job=9a2c token=7 worker=w1 seq=4\n"
    )
    code, out, err = audit(capsys, str(log), "--format", "json", "--strict")
    assert (code, err) == (1, "")
    finding = json.loads(out)
    assert {(c["kind"], c["effect_key"]) for c in finding["conditions"]} == {
        ("stale_effect_attempt", "ext-791"),
        ("stale_effect_attempt", "tool_request"),
    }


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("heartbeat_ok job=8f1b token=42 worker=w1 attrs=x attrs.tool_class=y", "attrs given"),
        ("heartbeat_ok job=8f1b token=42 worker=w1 detail=1 detail.x=2", "detail given"),
        ('heartbeat_ok job=8f1b token=42 worker="w1 seq=9', "unterminated quote"),
        ("progress kind=heartbeat job=8f1b token=42 worker=w1", "kind given twice"),
        (
            "heartbeat_ok job=8f1b workflow_key=other token=42 worker=w1",
            "workflow_key: given twice",
        ),
        ("heartbeat_ok job=8f1b token=42 fencing_token=43 worker=w1", "owner_epoch: given twice"),
        ("heartbeat_ok job=8f1b token=42 worker=w1 owner_id=w2", "worker_id: given twice"),
        (
            '{"event_id": "j", "kind": "heartbeat", "job": "a", "workflow_key": "b", '
            '"owner_epoch": 1, "worker_id": "w"}',
            "workflow_key: given twice",
        ),
        (
            '{"event_id": "j", "kind": "heartbeat", "workflow_key": "8f1b", '
            '"owner_epoch": 41, "owner_epoch": 42, "worker_id": "w1"}',
            "owner_epoch: given twice",
        ),
    ],
)
def test_a_line_that_says_one_thing_twice_is_a_bad_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, says: str
) -> None:
    log = tmp_path / "jobs.log"
    log.write_text((ROOT / "examples" / "job-queue.log").read_text() + line + "\n")
    code, _, err = audit(capsys, str(log), "--fail-on", "none")
    assert code == 0  # skipped, not fatal, and never a traceback that exits 1
    assert err.startswith("skipped line 11: ") and says in err
    code, out, err = audit(capsys, str(log), "--strict")
    assert (code, out) == (2, "")
    assert err.startswith("splitbrain audit: line 11: ") and says in err


# ---- retention caps, clocks and quiet periods ------------------------------------------------


def event_line(seq: int, kind: str, epoch: int, worker: str, **fields: object) -> str:
    """One JSON event of workflow `wf`, named by its seq; absent fields are left out."""
    doc = {
        "event_id": f"e{seq}",
        "seq": seq,
        "kind": kind,
        "workflow_key": "wf",
        "owner_epoch": epoch,
        "worker_id": worker,
        **{k: v for k, v in fields.items() if v is not None},
    }
    return json.dumps(doc)


def long_workflow(tmp_path: Path) -> Path:
    """Epoch 1 commits K and then 40 other effects; epoch 2 takes over and commits K again."""
    rows = [("lease_acquired", 1, "alpha", None), ("effect_committed", 1, "alpha", "K")]
    rows += [("effect_committed", 1, "alpha", f"other-{i}") for i in range(40)]
    rows += [("lease_acquired", 2, "beta", None), ("effect_committed", 2, "beta", "K")]
    history = tmp_path / "long.jsonl"
    history.write_text(
        "\n".join(
            event_line(
                seq,
                kind,
                epoch,
                worker,
                effect_key=key,
                source="coordinator" if key is None else "destination",
            )
            for seq, (kind, epoch, worker, key) in enumerate(rows, start=1)
        )
    )
    return history


def test_audit_defaults_keep_a_long_workflow_exact(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = audit(capsys, str(long_workflow(tmp_path)))
    assert code == 1
    assert "duplicate_effect K cause=failover" in out
    assert ", 0 workflows truncated" in out.splitlines()[0]
    assert "truncated:" not in out


def handoffs(tmp_path: Path) -> Path:
    """Five clean handoffs, each owner committing its own shard: no finding."""
    rows = []
    for epoch in range(1, 6):
        common = {"workflow_key": "handoffs", "owner_epoch": epoch, "worker_id": f"w{epoch}"}
        rows.append(
            {
                "event_id": f"a{epoch}",
                "seq": 2 * epoch,
                "kind": "lease_acquired",
                "source": "coordinator",
                **common,
            }
        )
        rows.append(
            {
                "event_id": f"c{epoch}",
                "seq": 2 * epoch + 1,
                "kind": "effect_committed",
                "effect_key": f"shard-{epoch}",
                "source": "destination",
                **common,
            }
        )
    history = tmp_path / "handoffs.jsonl"
    history.write_text("\n".join(json.dumps(row) for row in rows))
    return history


def test_a_workflow_cut_by_a_cap_is_named_and_never_called_clean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = str(handoffs(tmp_path))
    _, out, _ = audit(capsys, history)
    assert out.splitlines()[-1] == "clean (1): handoffs"
    code, out, err = audit(capsys, history, "--max-evidence", "1", "--max-acquisitions", "1")
    assert (code, err) == (0, "")
    assert "1 workflow truncated" in out.splitlines()[0]
    assert (
        "truncated: handoffs: evidence beyond --max-evidence/--max-acquisitions was forgotten; "
        "findings of this workflow may be incomplete (raise the caps)"
    ) in out.splitlines()
    assert "clean (" not in out


def test_a_truncated_finding_says_so_in_the_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, out, err = audit(
        capsys,
        str(long_workflow(tmp_path)),
        "--max-evidence",
        "1",
        "--max-acquisitions",
        "1",
        "--format",
        "json",
    )
    findings = [json.loads(line) for line in out.splitlines()]
    assert any(f["evidence_truncated"] for f in findings)
    assert all(f["confidence"] != "high" for f in findings if f["evidence_truncated"])
    assert "truncated: wf: " in err  # stdout holds findings only; the notice goes to stderr
    _, text, _ = audit(
        capsys, str(long_workflow(tmp_path)), "--max-evidence", "1", "--max-acquisitions", "1"
    )
    assert ", evidence truncated, ordering" in text


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-evidence", "0"),
        ("--max-evidence", "many"),
        ("--max-acquisitions", "-3"),
        ("--max-acquisitions", "2.5"),
        ("--clock-skew-s", "-1"),
        ("--clock-skew-s", "nan"),
        ("--quiet-period-s", "ten"),
    ],
)
def test_a_bad_cap_or_period_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["audit", str(FIXTURE), flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err


def quiet_history(tmp_path: Path, *, late: str = "2026-07-26T10:16:40Z") -> Path:
    """Epoch 1 attempts k after epoch 2 took over; a verifier confirms k; the workflow's next
    event comes `late`: 980 s after the stale attempt by default."""
    rows = [
        ("lease_acquired", 1, "alpha", "coordinator", None, "10:00:00"),
        ("lease_acquired", 2, "beta", "coordinator", None, "10:00:10"),
        ("effect_attempted", 1, "alpha", "worker", "k", "10:00:20"),
        ("outcome_verified", 2, "checker", "verifier", "k", "10:00:30"),
    ]
    lines = [
        event_line(
            seq, kind, epoch, worker, source=source, effect_key=key, observed_at=f"2026-07-26T{at}Z"
        )
        for seq, (kind, epoch, worker, source, key, at) in enumerate(rows, start=1)
    ]
    lines.append(event_line(5, "heartbeat", 2, "beta", observed_at=late))
    history = tmp_path / "quiet.jsonl"
    history.write_text("\n".join(lines))
    return history


def status_of(out: str) -> str:
    return str(json.loads(out)["status"])


def test_the_quiet_period_is_the_flag_s(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    history = str(quiet_history(tmp_path))
    assert status_of(audit(capsys, history, "--format", "json")[1]) == "resolved"
    assert status_of(audit(capsys, history, "--format", "json", "--quiet-period-s", "2000")[1]) == (
        "open"
    )


def test_a_time_beyond_the_clock_skew_bound_is_counted_and_not_believed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = str(quiet_history(tmp_path, late="2099-01-01T00:00:00Z"))
    _, out, _ = audit(capsys, history)
    assert "1 observed_at time beyond the clock-skew bound was not believed" in out.splitlines()
    _, out, _ = audit(capsys, history, "--clock-skew-s", "1e10")
    assert "not believed" not in out


# ---- control characters ----------------------------------------------------------------------

FORGED = "wf\n\x1b[31mCRITICAL export-ledger: all clear\x1b[0m\r\x07\x9b\u2028"


def test_control_characters_in_user_strings_are_escaped_in_the_text_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    history = tmp_path / "h.jsonl"
    lines = [
        {
            "event_id": "a\x1b]0;title\x07",
            "seq": 1,
            "kind": "lease_acquired",
            "workflow_key": FORGED,
            "owner_epoch": 1,
            "worker_id": "w\r1",
            "source": "coordinator",
        },
        {
            "event_id": "b",
            "seq": 2,
            "kind": "lease_acquired",
            "workflow_key": FORGED,
            "owner_epoch": 2,
            "worker_id": "w2\n",
            "source": "coordinator",
        },
        {
            "event_id": "c\n",
            "seq": 3,
            "kind": "effect_committed",
            "workflow_key": FORGED,
            "owner_epoch": 1,
            "worker_id": "w\r1",
            "effect_key": "k\x1b[2J",
            "source": "destination",
        },
        {
            "event_id": "d",
            "seq": 4,
            "kind": "heartbeat",
            "workflow_key": "clean\x1b[1m",
            "owner_epoch": 1,
            "worker_id": "w",
        },
    ]
    history.write_text("\n".join(json.dumps(line) for line in lines))
    code, out, _ = audit(capsys, str(history))
    assert code == 1
    unprintable = [ch for ch in out if ch != "\n" and not ch.isprintable()]
    assert unprintable == []
    assert "wf\\n\\x1b[31mCRITICAL export-ledger: all clear\\x1b[0m\\r\\x07\\x9b\\u2028" in out
    assert "k\\x1b[2J" in out and "w\\r1" in out and "c\\n" in out
    assert "clean (1): clean\\x1b[1m" in out
    assert not any(line.startswith("CRITICAL export-ledger") for line in out.splitlines())


def test_tail_escapes_what_it_prints_like_audit() -> None:
    from detector.kafka.findings import FindingsView, one_line, summary  # noqa: PLC0415 (Kafka client)

    history = [
        json.dumps(
            {
                "event_id": "a",
                "seq": 1,
                "kind": "lease_acquired",
                "workflow_key": FORGED,
                "owner_epoch": 1,
                "worker_id": "w1",
                "source": "coordinator",
            }
        ).encode(),
        json.dumps(
            {
                "event_id": "b",
                "seq": 2,
                "kind": "lease_acquired",
                "workflow_key": FORGED,
                "owner_epoch": 2,
                "worker_id": "w2",
                "source": "coordinator",
            }
        ).encode(),
        json.dumps(
            {
                "event_id": "c",
                "seq": 3,
                "kind": "progress",
                "workflow_key": FORGED,
                "owner_epoch": 1,
                "worker_id": "w1\x1b[8m",
            }
        ).encode(),
    ]
    (finding,) = audit_lines(history).findings.values()
    view = FindingsView()
    view.findings[finding.finding_id] = finding
    for text in (one_line(finding), summary(view, "topic\n")):
        assert [ch for ch in text if ch != "\n" and not ch.isprintable()] == []
        assert "wf\\n\\x1b[31mCRITICAL" in text


# ---- --expect files --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"findings": {}}',
        '{"findings": [{"severity": "critical"}]}',
        '{"findings": [{"workflow_key": "export-ledger", "conditions": [{"seq": 6}]}]}',
        '{"findings": [{"workflow_key": "export-ledger", "displaced_epoch": "seventeen"}]}',
        '{"clean": "report-index"}',
    ],
)
def test_a_malformed_expectation_is_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str
) -> None:
    path = tmp_path / "expected.json"
    path.write_text(content)
    code, out, err = audit(capsys, str(FIXTURE), "--expect", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"splitbrain audit: --expect: {path}") and err.count("\n") == 1


def test_a_missing_expectation_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = audit(capsys, str(FIXTURE), "--expect", "/nonexistent/expected.json")
    assert (code, out) == (2, "")
    assert "cannot read /nonexistent/expected.json" in err and err.count("\n") == 1


def _committed(event_id: str, epoch: int, seq: int, key: str) -> str:
    return json.dumps(
        {
            "event_id": event_id,
            "kind": "effect_committed",
            "workflow_key": "wf",
            "owner_epoch": epoch,
            "worker_id": f"w{epoch}",
            "seq": seq,
            "source": "destination",
            "effect_key": key,
        }
    )


def _acquired(event_id: str, epoch: int, seq: int) -> str:
    return json.dumps(
        {
            "event_id": event_id,
            "kind": "lease_acquired",
            "workflow_key": "wf",
            "owner_epoch": epoch,
            "worker_id": f"w{epoch}",
            "seq": seq,
            "source": "coordinator",
        }
    )


# Two retry findings on one workflow (`displaced: null`): k1 committed twice under epoch 1,
# then, after a clean handoff, k2 committed twice under epoch 2.
TWO_RETRIES = [
    _acquired("a1", 1, 1),
    _committed("c1", 1, 2, "k1"),
    _committed("c2", 1, 3, "k1"),
    _acquired("a2", 2, 4),
    _committed("c3", 2, 5, "k2"),
    _committed("c4", 2, 6, "k2"),
]


def _retry(current: int | None = None, seq: int | None = None) -> dict[str, object]:
    want: dict[str, object] = {
        "workflow_key": "wf",
        "severity": "warning",
        "status": "open",
        "displaced_epoch": None,
        "conditions": [{"kind": "duplicate_effect", "cause": "retry"}],
    }
    if current is not None:
        want["current_epoch"] = current
    if seq is not None:
        want["conditions"] = [{"kind": "duplicate_effect", "cause": "retry", "seq": seq}]
    return want


def _expect(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *wants: dict[str, object]
) -> tuple[int, list[str]]:
    history, path = tmp_path / "h.jsonl", tmp_path / "expected.json"
    history.write_text("\n".join(TWO_RETRIES) + "\n")
    path.write_text(json.dumps({"findings": list(wants), "clean": []}))
    code, out, _ = audit(capsys, str(history), "--format", "json", "--expect", str(path))
    return code, [line for line in out.splitlines() if not line.startswith("{")]


def test_the_history_has_two_retry_findings_on_one_workflow() -> None:
    result = audit_lines(line.encode() for line in TWO_RETRIES)
    got = sorted(
        (f.displaced, f.current.owner_epoch if f.current else None, f.conditions[-1].seq)
        for f in result.findings.values()
    )
    assert got == [(None, 1, 3), (None, 2, 6)]


@pytest.mark.parametrize(
    "want",
    [_retry(current=2, seq=6), _retry(current=2), _retry(seq=6)],
    ids=["by-epoch-and-seq", "by-epoch", "by-seq"],
)
def test_an_expected_finding_may_be_any_finding_of_its_workflow(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, want: dict[str, object]
) -> None:
    """DESIGN §6: each listed finding must exist. The checker compared an entry only with the
    first finding of its displaced epoch, so the second retry finding could never be listed."""
    assert _expect(capsys, tmp_path, want) == (0, ["PASS"])


def test_two_listed_findings_need_two_findings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, lines = _expect(capsys, tmp_path, _retry(current=2), _retry(current=2))
    assert (code, lines[-1]) == (1, "FAIL")
    (problem,) = lines[:-1]
    assert problem.startswith("  wf: expected finding 2 (displaced_epoch null, current_epoch 2,")
    assert "needs a finding of its own" in problem and "by expected finding 1" in problem


def test_entries_are_assigned_to_findings_one_to_one_not_first_come(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The first entry (any retry finding) could take the only finding the second (epoch 1)
    accepts: a matching, not a greedy pass, gives each entry its own."""
    assert _expect(capsys, tmp_path, _retry(), _retry(current=1)) == (0, ["PASS"])
    assert _expect(capsys, tmp_path, _retry(), _retry(), _retry())[0] == 1


def test_an_unmet_expectation_names_the_closest_finding_and_how_it_differs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    want = {**_retry(current=2, seq=7), "severity": "critical"}
    code, lines = _expect(capsys, tmp_path, want, {"workflow_key": "other"})
    assert (code, lines[-1]) == (1, "FAIL")
    closest, other = lines[:-1]
    assert closest.startswith("  wf: expected finding 1 (displaced_epoch null, current_epoch 2,")
    assert "no finding matches; the closest of its 2, sb-" in closest
    assert "(displaced_epoch null, current_epoch 2, warning, open), differs: " in closest
    assert closest.endswith(
        'severity warning, expected critical; missing condition {"kind": "duplicate_effect", '
        '"seq": 7, "cause": "retry"}'
    )
    assert other == "  other: expected finding 2: no finding for this workflow"


def _most_pairs(meets: list[list[int]], i: int = 0, used: frozenset[int] = frozenset()) -> int:
    """The size of a maximum matching, by trying every assignment (small inputs only)."""
    if i == len(meets):
        return 0
    skip = _most_pairs(meets, i + 1, used)
    return max(
        [skip, *(1 + _most_pairs(meets, i + 1, used | {j}) for j in meets[i] if j not in used)]
    )


@given(
    st.integers(0, 5).flatmap(
        lambda findings: st.lists(
            st.lists(st.integers(0, findings - 1), unique=True) if findings else st.just([]),
            max_size=5,
        )
    )
)
def test_entries_and_findings_are_matched_one_to_one_as_many_as_can_be(
    meets: list[list[int]],
) -> None:
    owner = _one_to_one(meets)
    held = [j for j in owner if j is not None]
    assert len(held) == len(set(held))
    assert all(j in meets[i] for i, j in enumerate(owner) if j is not None)
    assert len(held) == _most_pairs(meets)
