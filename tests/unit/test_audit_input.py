"""What `splitbrain audit` reads (DESIGN §3, §6): compressed, marked or hostile input is either
read as the history it is or refused with exit 2 and one line, never audited as "clean"."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detector.cli import main
from detector.contracts.events import MAX_EVENT_BYTES
from detector.histories.audit import KEPT_BAD_LINES, audit_lines
from tests.paths import ROOT, SEED_FIXTURE

SEED = SEED_FIXTURE.read_bytes()
CLI = [sys.executable, "-m", "detector.cli", "audit"]


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def cli(
    *args: str, stdin: bytes | None = None, shell_stdin: str = ""
) -> subprocess.CompletedProcess[bytes]:
    """The console command in a child process, for standard input and pipes."""
    if shell_stdin:
        command = " ".join([*map(_quote, [*CLI, *args]), shell_stdin])
        return subprocess.run(["sh", "-c", command], capture_output=True, check=False, cwd=ROOT)
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, check=False, cwd=ROOT)


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    return err


# ---- gzip, byte order marks, binary ----------------------------------------------------------


def test_a_gzip_history_is_read_like_the_plain_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plain = audit(capsys, str(SEED_FIXTURE), "--format", "json")
    packed = tmp_path / "history.jsonl.gz"
    packed.write_bytes(gzip.compress(SEED))
    assert audit(capsys, str(packed), "--format", "json") == plain
    assert plain[0] == 1


def test_gzip_is_recognised_by_its_bytes_whatever_the_name_and_on_standard_input(
    tmp_path: Path,
) -> None:
    disguised = tmp_path / "history.jsonl"
    disguised.write_bytes(gzip.compress(SEED))
    for proc in (
        cli(str(disguised), "--format", "json"),
        cli("-", "--format", "json", stdin=gzip.compress(SEED)),
    ):
        assert proc.returncode == 1, proc.stderr
        assert json.loads(proc.stdout)["severity"] == "critical"


def test_a_broken_gzip_stream_is_unusable_input_not_a_short_clean_history(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(SEED * 50)[:-40])
    code, out, err = audit(capsys, str(cut))
    assert (code, out) == (2, "")
    assert "gzip" in one_line_error(err)


@pytest.mark.parametrize(
    "garbage",
    [
        os.urandom(1 << 20),  # 1 MiB of noise
        b"\x00" * 100 + SEED,  # NULs first: not a text history
        gzip.compress(os.urandom(4096)),  # noise, compressed
    ],
)
def test_binary_input_is_refused_with_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, garbage: bytes
) -> None:
    path = tmp_path / "blob"
    path.write_bytes(garbage)
    code, out, err = audit(capsys, str(path))
    assert (code, out) == (2, "")
    assert "binary" in one_line_error(err)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_text_file_where_no_line_is_an_event_is_exit_2_never_clean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("Dear on-call,\nplease audit this.\n= thanks =\n")
    code, out, err = audit(capsys, str(path), "--format", fmt)
    assert (code, out) == (2, "")
    assert err.count("skipped line") == 3  # each bad line says why
    assert "none of its 3 lines is a valid event" in err.splitlines()[-1]


def test_a_byte_order_mark_does_not_cost_the_first_event(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    marked = tmp_path / "bom.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + SEED)
    code, out, err = audit(capsys, str(marked))
    assert code == 1
    assert out.startswith(
        "splitbrain audit: 16 events, 3 workflows, 1 finding (1 critical), 0 lines"
    )
    assert err == ""


def test_a_byte_order_mark_before_a_logfmt_line_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "bom.log"
    log.write_bytes(b"\xef\xbb\xbf" + (ROOT / "examples" / "job-queue.log").read_bytes())
    code, _, err = audit(capsys, str(log), "--strict")
    assert (code, err) == (1, "")


# ---- line length ------------------------------------------------------------------------------


def padded(size: int) -> bytes:
    """A valid event of exactly `size` bytes (an unknown field makes up the length)."""
    doc = {
        "event_id": "p",
        "kind": "progress",
        "workflow_key": "pad",
        "owner_epoch": 1,
        "worker_id": "w",
        "pad": "",
    }
    short = json.dumps(doc).encode()
    doc["pad"] = "x" * (size - len(short))
    line = json.dumps(doc).encode()
    assert len(line) == size
    return line


def test_a_line_at_the_event_limit_is_read_and_one_byte_more_is_a_bad_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "long.jsonl"
    path.write_bytes(padded(MAX_EVENT_BYTES) + b"\r\n" + padded(MAX_EVENT_BYTES + 1) + b"\n" + SEED)
    code, out, err = audit(capsys, str(path))
    assert code == 1  # the history around the long line is still audited
    assert out.startswith("splitbrain audit: 17 events, 4 workflows")
    (line,) = err.splitlines()
    assert line.startswith("skipped line 2: too_large")
    assert str(MAX_EVENT_BYTES) in line


def test_a_huge_line_is_refused_without_ending_the_history(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "huge.jsonl"
    path.write_bytes(b'{"event_id": "' + b"x" * (8 << 20) + b'"}\n' + SEED)
    code, out, err = audit(capsys, str(path), "--format", "json")
    assert code == 1
    assert json.loads(out)["workflow_key"] == "export-ledger"
    assert err.startswith("skipped line 1: too_large") and err.count("\n") == 1


def test_the_limit_holds_under_strict_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "long.jsonl"
    path.write_bytes(SEED + padded(MAX_EVENT_BYTES + 1))
    code, out, err = audit(capsys, str(path), "--strict")
    assert (code, out) == (2, "")
    assert "line 17: too_large" in one_line_error(err)


# ---- many bad lines ---------------------------------------------------------------------------


def test_bad_lines_are_counted_and_only_the_first_are_kept() -> None:
    """Memory must not grow with the garbage in a history: every bad line is printed as it
    comes and counted; a few are kept, without the traceback of the error that made them."""
    bad = [b'{"event_id": "x", "kind": "progress"}'] * (KEPT_BAD_LINES * 5)
    result = audit_lines([*bad, *SEED.splitlines()])
    assert result.bad_count == KEPT_BAD_LINES * 5
    assert len(result.bad_lines) == KEPT_BAD_LINES
    assert result.events == 16 and len(result.findings) == 1
    for kept in result.bad_lines:
        assert kept.error.__traceback__ is None and kept.error.__context__ is None
        assert kept.error.field == "workflow_key"


# ---- standard input and output ---------------------------------------------------------------


def test_closed_standard_input_is_one_line_and_exit_2() -> None:
    proc = cli("-", shell_stdin="<&-")
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert "standard input is closed" in one_line_error(proc.stderr.decode())


def test_empty_standard_input_is_an_empty_history() -> None:
    proc = cli("-", stdin=b"")
    assert (proc.returncode, proc.stderr) == (0, b"")


@pytest.mark.parametrize(
    ("fmt", "fail_on", "status"), [("json", "warning", 1), ("text", "none", 0)]
)
def test_a_reader_that_goes_away_leaves_the_exit_status_to_the_findings(
    fmt: str, fail_on: str, status: int
) -> None:
    """`splitbrain audit x --format json | head -1`: the pipe closes before the report is
    written; the status is still the one the findings decide, with no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails with EPIPE
    try:
        proc = subprocess.run(
            [*CLI, str(SEED_FIXTURE), "--format", fmt, "--fail-on", fail_on],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
            cwd=ROOT,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == status
    assert proc.stderr == b""
