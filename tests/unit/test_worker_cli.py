"""`splitbrain worker`'s settings are checked before anything starts, and only its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.cli import main
from tests.paths import SEED_FIXTURE


def test_a_worker_variable_never_breaks_another_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPLITBRAIN_COMMIT_INTERVAL_MS", "abc")
    monkeypatch.setenv("SPLITBRAIN_MAX_EVIDENCE", "")
    assert main(["audit", str(SEED_FIXTURE)]) == 1  # the critical finding decides
    assert "critical" in capsys.readouterr().out.lower()


@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [
        ("SPLITBRAIN_COMMIT_INTERVAL_MS", "abc", "--commit-interval-ms"),
        ("SPLITBRAIN_MAX_EVIDENCE", "", "--max-evidence"),
        ("SPLITBRAIN_MAX_EFFECT_KEYS", "0", "--max-effect-keys"),
        ("SPLITBRAIN_QUIET_PERIOD_S", "-1", "--quiet-period-s"),
        ("SPLITBRAIN_METRICS_PORT", "70000", "--metrics-port"),
    ],
)
def test_a_bad_value_names_its_flag_and_exits_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    flag: str,
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        main(["worker", "--bootstrap-servers", "127.0.0.1:9"])
    assert stopped.value.code == 2
    assert f"argument {flag}: expected" in capsys.readouterr().err


def test_a_state_dir_that_cannot_be_made_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["worker", "--bootstrap-servers", "127.0.0.1:9", "--state-dir", f"{blocker}/x"])
    assert code == 2
    assert f"--state-dir {blocker}/x" in capsys.readouterr().err


def test_a_period_of_zero_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["worker", "--bootstrap-servers", "127.0.0.1:9", "--quiet-period-s", "0"])
    assert code == 2
    assert "--quiet-period-s: quiet_period_s must be more than 0" in capsys.readouterr().err


def test_audit_refuses_a_quiet_period_of_zero_by_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["audit", str(SEED_FIXTURE), "--quiet-period-s", "0"])
    assert stopped.value.code == 2
    assert "argument --quiet-period-s: expected seconds more than 0" in capsys.readouterr().err
