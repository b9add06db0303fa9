"""`splitbrain worker`'s settings are checked before anything starts, and only its own."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from detector.cli import main
from detector.cli.main import build_parser
from detector.cli.worker import WorkerCommandSettings
from detector.contracts.topics import GROUP_ID
from detector.core import Config, Detector
from detector.runtime import kafka_loop
from detector.runtime.settings import WorkerSettings
from detector.settings import ENV_PREFIX, SettingsError, flag
from tests.paths import SEED_FIXTURE

WORKER = ("worker", "--bootstrap-servers", "127.0.0.1:9")


@pytest.fixture(autouse=True)
def _only_the_tests_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `SPLITBRAIN_` variable of the shell running the tests, and the default state
    directory (relative) under tmp_path."""
    for name in os.environ:
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[WorkerSettings]:
    """The settings the kafka runtime was started with, instead of starting it."""
    runs: list[WorkerSettings] = []

    def run_kafka_loop(
        settings: WorkerSettings,
        metrics: object,
        engine: type[Detector],
        loop: type[kafka_loop.KafkaLoopWorker] | None,
    ) -> int:
        assert settings.state_dir.is_dir()
        assert engine is Detector  # the command's engine raises on no event on purpose
        assert loop is None  # nor stalls on purpose: the runtime's own loop
        runs.append(settings)
        return 0

    monkeypatch.setattr(kafka_loop, "run_kafka_loop", run_kafka_loop)
    return runs


def test_a_flag_beats_its_variable_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch, started: list[WorkerSettings], tmp_path: Path
) -> None:
    monkeypatch.setenv("SPLITBRAIN_COMMIT_INTERVAL_MS", "250")
    monkeypatch.setenv("SPLITBRAIN_COMMIT_MAX_EVENTS", "7")
    monkeypatch.setenv("SPLITBRAIN_QUIET_PERIOD_S", "30")
    monkeypatch.setenv("SPLITBRAIN_MAX_EVIDENCE", "abc")  # never read: its flag is given
    monkeypatch.setenv("SPLITBRAIN_SECURITY_PROTOCOL", "SSL")
    argv = [*WORKER, "--commit-max-events", "9", "--max-evidence", "64", "--metrics-port", "0"]
    assert main(argv) == 0
    (settings,) = started
    assert (settings.commit_interval_ms, settings.commit_max_events) == (250, 9)
    assert settings.engine == Config(quiet_period_s=30, max_evidence=64)
    assert (settings.group_id, settings.instance_id) == (GROUP_ID, socket.gethostname())
    assert (settings.store, settings.metrics_port) == ("memory", None)
    assert settings.state_dir == Path("var/state")
    assert (tmp_path / "var" / "state").is_dir()
    assert settings.kafka["bootstrap.servers"] == "127.0.0.1:9"
    assert settings.kafka["security.protocol"] == "SSL"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("SPLITBRAIN_COMMIT_INTERVAL_MS", "abc", "a whole number from 1 to 2147483647"),
        ("SPLITBRAIN_MAX_EFFECT_KEYS", "0", "a whole number from 1 to 2147483647"),
        ("SPLITBRAIN_QUIET_PERIOD_S", "0", "seconds more than 0 to 1000000000000"),
        ("SPLITBRAIN_IDLE_SWEEP_S", "nan", "seconds from 0 to 1000000000000"),
        ("SPLITBRAIN_METRICS_PORT", "70000", "a port number from 0 to 65535"),
        (
            "SPLITBRAIN_METRICS_ADDRESS",
            "localhost",
            "an IP address to listen on (127.0.0.1, 0.0.0.0, ::)",
        ),
        ("SPLITBRAIN_RUNTIME", "spark", "one of kafka, faust"),
        (
            "SPLITBRAIN_PROCESSING_GUARANTEE",
            "exactly_once",
            "one of exactly-once, at-least-once",
        ),
        ("SPLITBRAIN_LOG_LEVEL", "loud", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ],
)
def test_a_bad_variable_is_named_with_the_form_expected_and_exits_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    started: list[WorkerSettings],
    variable: str,
    value: str,
    expected: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(WORKER) == 2
    assert (
        capsys.readouterr().err == f"splitbrain worker: {variable}={value!r}: expected {expected}\n"
    )
    assert started == []


def test_a_bad_flag_is_named_and_each_bad_value_has_its_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPLITBRAIN_STORE", "disk")
    assert main([*WORKER, "--commit-interval-ms", "1.5", "--jitter-reserve-s", "-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "splitbrain worker: --commit-interval-ms='1.5': expected a whole number from 1 to "
        "2147483647",
        "splitbrain worker: SPLITBRAIN_STORE='disk': expected one of memory, rocksdb",
        "splitbrain worker: --jitter-reserve-s='-1': expected seconds from 0 to 1000000000000",
    ]


def test_the_guarantee_is_exactly_once_unless_at_least_once_is_asked_for(
    started: list[WorkerSettings],
) -> None:
    assert main(WORKER) == 0
    assert main([*WORKER, "--processing-guarantee", "at-least-once"]) == 0
    assert [s.processing_guarantee for s in started] == ["exactly-once", "at-least-once"]


def test_at_least_once_is_refused_to_the_faust_runtime_by_flag_or_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    faust = ["--runtime", "faust"]
    assert main([*WORKER, *faust, "--processing-guarantee", "at-least-once"]) == 2
    assert capsys.readouterr().err == (
        "splitbrain worker: --processing-guarantee='at-least-once': expected exactly-once with "
        "--runtime='faust' (only the kafka runtime writes at least once)\n"
    )
    monkeypatch.setenv("SPLITBRAIN_RUNTIME", "faust")
    monkeypatch.setenv("SPLITBRAIN_PROCESSING_GUARANTEE", "at-least-once")
    assert main(WORKER) == 2
    assert capsys.readouterr().err == (
        "splitbrain worker: SPLITBRAIN_PROCESSING_GUARANTEE='at-least-once': expected "
        "exactly-once with SPLITBRAIN_RUNTIME='faust' (only the kafka runtime writes at least "
        "once)\n"
    )
    assert not (tmp_path / "var").exists()  # refused before anything started


def test_standbys_are_off_unless_asked_for_and_refused_to_the_faust_runtime(
    started: list[WorkerSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(WORKER) == 0
    assert main([*WORKER, "--standby", "all"]) == 0
    assert [s.standby for s in started] == ["off", "all"]
    assert main([*WORKER, "--runtime", "faust", "--standby", "all"]) == 2
    assert capsys.readouterr().err == (
        "splitbrain worker: --standby='all': expected off with --runtime='faust' (standbys are "
        "the kafka runtime's)\n"
    )


def test_the_transaction_timeout_is_10_s_unless_set_and_refused_to_the_faust_runtime(
    started: list[WorkerSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(WORKER) == 0
    assert main([*WORKER, "--transaction-timeout-ms", "60000"]) == 0
    assert [s.transaction_timeout_ms for s in started] == [10_000, 60_000]
    assert main([*WORKER, "--transaction-timeout-ms", "999"]) == 2
    assert "--transaction-timeout-ms" in (err := capsys.readouterr().err), err
    assert "milliseconds from 1000" in err, err
    assert main([*WORKER, "--runtime", "faust", "--transaction-timeout-ms", "60000"]) == 2
    assert capsys.readouterr().err == (
        "splitbrain worker: --transaction-timeout-ms='60000': expected 10000 with "
        "--runtime='faust' (faust's transactions keep aiokafka's 60 s)\n"
    )
    assert len(started) == 2


def test_a_bad_guarantee_flag_names_the_flag_and_its_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*WORKER, "--processing-guarantee", "once"]) == 2
    assert capsys.readouterr().err == (
        "splitbrain worker: --processing-guarantee='once': expected one of exactly-once, "
        "at-least-once\n"
    )


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        ("SPLITBRAIN_MAX_EVIDENCE", "a whole number from 1 to 2147483647"),
        ("SPLITBRAIN_GROUP_ID", "a non-empty name"),
        ("SPLITBRAIN_STATE_DIR", "a directory path"),
    ],
)
def test_an_empty_variable_is_refused_not_taken_as_unset(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    expected: str,
) -> None:
    monkeypatch.setenv(variable, "")
    assert main(WORKER) == 2
    assert capsys.readouterr().err == (
        f"splitbrain worker: {variable}='': expected {expected}; "
        "unset the variable to use the default\n"
    )


def test_a_worker_variable_never_breaks_another_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPLITBRAIN_COMMIT_INTERVAL_MS", "abc")
    monkeypatch.setenv("SPLITBRAIN_MAX_EVIDENCE", "")
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "")
    assert main(["audit", str(SEED_FIXTURE)]) == 1  # the critical finding decides
    out = capsys.readouterr()
    assert "critical" in out.out.lower()
    assert out.err == ""


def test_every_engine_and_worker_setting_is_a_flag_and_a_variable() -> None:
    names = {f.name for f in fields(Config)} | {f.name for f in fields(WorkerSettings)}
    names -= {"engine", "kafka"}  # built from the settings named here and the Kafka ones
    assert names <= set(WorkerCommandSettings.model_fields)
    parser = build_parser()
    for name in WorkerCommandSettings.model_fields:
        assert getattr(parser.parse_args(["worker", flag(name), "x"]), name) == "x"


def _accepts(build: Callable[[], object]) -> bool:
    try:
        build()
    except (ValueError, SettingsError):
        return False
    return True


@pytest.mark.parametrize("name", [f.name for f in fields(Config)])
@pytest.mark.parametrize("value", [-1, 0, 1])
def test_an_engine_flag_refuses_a_value_exactly_when_the_engine_does(name: str, value: int) -> None:
    args = argparse.Namespace(**{name: str(value)})
    assert _accepts(lambda: WorkerCommandSettings.from_args(args)) == _accepts(
        lambda: Config(**{name: value})
    )


def test_the_state_directory_is_created(started: list[WorkerSettings], tmp_path: Path) -> None:
    assert main([*WORKER, "--state-dir", str(tmp_path / "a" / "b")]) == 0
    assert started[0].state_dir.is_dir()


def test_a_state_dir_that_cannot_be_made_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*WORKER, "--state-dir", f"{blocker}/x"]) == 2
    assert f"--state-dir='{blocker}/x': cannot create the directory: " in capsys.readouterr().err
    monkeypatch.setenv("SPLITBRAIN_STATE_DIR", f"{blocker}/y")
    assert main(WORKER) == 2
    assert f"SPLITBRAIN_STATE_DIR='{blocker}/y': cannot create" in capsys.readouterr().err


def test_audit_refuses_a_quiet_period_of_zero_by_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["audit", str(SEED_FIXTURE), "--quiet-period-s", "0"])
    assert stopped.value.code == 2
    assert "argument --quiet-period-s: expected seconds more than 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["a b", "..", "w/1", "x" * 250])
def test_an_instance_id_kafka_refuses_as_a_group_instance_id_is_named(
    capsys: pytest.CaptureFixture[str], started: list[WorkerSettings], value: str
) -> None:
    assert main([*WORKER, "--instance-id", value]) == 2
    assert capsys.readouterr().err == (
        f"splitbrain worker: --instance-id={value!r}: expected 1 to 249 letters, digits, '.', "
        "'_' or '-' (not . or ..)\n"
    )
    assert started == []
