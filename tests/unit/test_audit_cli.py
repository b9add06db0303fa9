"""`splitbrain audit` as a user meets it: exit codes, reports, bad lines, --expect."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from detector.cli import main
from tests.paths import PUBLISHED, ROOT, SEED_EXPECTED, SEED_FIXTURE

FIXTURE, EXPECTED = SEED_FIXTURE, SEED_EXPECTED


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_published_fixture_passes_its_expectation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = audit(capsys, str(FIXTURE), "--expect", str(EXPECTED))
    assert (code, out.strip().splitlines()[-1]) == (0, "PASS")


@pytest.mark.skipif(not PUBLISHED.exists(), reason="shared/ is not beside this checkout")
def test_examples_hold_the_published_history_verbatim() -> None:
    assert FIXTURE.read_bytes() == (PUBLISHED / "seed-fixture.jsonl").read_bytes()
    assert EXPECTED.read_bytes() == (PUBLISHED / "seed-fixture.expected.json").read_bytes()


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
    history.write_bytes(b"job_claimed job=a token=1 worker=\xff\xfe seq=1\n")
    code, _, err = audit(capsys, str(history))
    assert code == 0
    assert "line 1: not UTF-8" in err


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
