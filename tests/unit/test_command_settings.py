"""Every command checks its flags and variables before it starts anything: a bad value exits 2
with one line that names the flag or the variable it came from and the form expected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from detector.cli import main
from detector.cli.main import build_parser
from detector.kafka.config import KafkaConnection
from detector.kafka.emit import Emitter
from detector.settings import ENV_PREFIX, SettingsError

COUNT = "a whole number from 1 to 2147483647"
SECONDS = "seconds more than 0 to 1000000000000"
NUMBER = "a number more than 0 to 1000000000000"
PORT = "a port number from 0 to 65535"
ADDRESS = "an IP address to listen on (127.0.0.1, 0.0.0.0, ::)"
DSN = ("--dsn", "host=127.0.0.1 port=9 dbname=splitbrain")
QUORUM = "1, or 3 or more (a KRaft quorum)"
EMPTY = "expected a non-empty value; unset the variable to use the default"


@pytest.fixture(autouse=True)
def _only_the_tests_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `SPLITBRAIN_` variable of the shell running the tests; nothing written outside
    tmp_path."""
    for name in os.environ:
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


# (the command's words, the bad flag, its value, the form expected); `NEEDS` adds what the command
# requires besides, so that only the bad flag is refused.
NEEDS = {
    "audit": ("h.jsonl",),
    "replay": ("h.jsonl",),
    "watch etcd": ("--endpoints", "http://127.0.0.1:9", "--prefix", "lock"),
    "watch kubernetes": ("--namespace", "jobs"),
    "export": ("alerts", "out"),
    "probe": ("http://127.0.0.1:9",),
}
FLAG_ONLY = [
    ("audit", "--max-evidence", "0", COUNT),
    ("audit", "--clock-skew-s", "nan", SECONDS),
    ("replay", "--rate", "0", NUMBER),
    ("replay", "--rate", "inf", NUMBER),
    ("replay", "--flush-timeout", "-1", SECONDS),
    ("tail", "--idle-timeout", "-2", SECONDS),
    ("topics apply", "--timeout", "0", SECONDS),
    ("watch etcd", "--metrics-port", "70000", PORT),
    ("watch etcd", "--idle-timeout", "0", SECONDS),
    ("watch kubernetes", "--metrics-port", "-1", PORT),
    ("leases relay", "--metrics-port", "65536", PORT),
    ("leases relay", "--metrics-address", "localhost", ADDRESS),
    ("leases relay", "--batch", "0", COUNT),
    ("leases destination", "--port", "http", PORT),
    ("leases inspect", "--limit", "0", COUNT),
    ("leases prune", "--older-than", "0", COUNT),
    ("demo", "--jobs", "0", COUNT),
    ("demo", "--job-rate", "0", NUMBER),
    ("demo", "--timeout", "inf", SECONDS),
    ("demo", "--prometheus-port", "70000", PORT),
    ("dev up", "--destination-port", "70000", PORT),
    ("dev up", "--alertmanager-port", "-1", PORT),
    ("dev up", "--brokers", "2", QUORUM),
    ("dev up", "--timeout", "0", SECONDS),
    ("dev kafka start", "--brokers", "0", QUORUM),
    ("dev kafka start", "--timeout", "-1", SECONDS),
    ("dev kafka stop", "--timeout", "0", SECONDS),
    ("export", "--label", "no label", "KEY=VALUE with a Kubernetes label key and value"),
    ("probe", "--fence", "0", "a whole number from 1 to 9223372036854775806"),
    ("probe", "--second-fence", "-1", "a whole number from 0 to 9223372036854775806"),
]


@pytest.mark.parametrize(("command", "flag", "value", "form"), FLAG_ONLY)
def test_a_bad_flag_of_the_command_line_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], command: str, flag: str, value: str, form: str
) -> None:
    with pytest.raises(SystemExit) as stopped:  # refused while parsing: the command never runs
        build_parser().parse_args([*command.split(), *NEEDS.get(command, ()), f"{flag}={value}"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"splitbrain {command}: error: argument {flag}: expected {form}, got {value!r}"
    )


def test_a_job_id_that_is_not_a_uuid_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["leases", "cancel", *DSN, "job-7"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "splitbrain leases cancel: error: argument JOB: expected a job id (a UUID), got 'job-7'"
    )


# (the command line, as the error names the command, the variable, its value, the line expected)
VARIABLES = [
    (("replay", "h.jsonl"), "replay", "SPLITBRAIN_BOOTSTRAP_SERVERS", "", EMPTY),
    (("tail",), "tail", "SPLITBRAIN_SECURITY_PROTOCOL", "", EMPTY),
    (("topics", "apply"), "topics apply", "SPLITBRAIN_SASL_MECHANISM", "", EMPTY),
    (
        ("watch", "etcd", *NEEDS["watch etcd"]),
        "watch etcd",
        "SPLITBRAIN_SSL_CA_LOCATION",
        "",
        EMPTY,
    ),
    (
        ("watch", "kubernetes", *NEEDS["watch kubernetes"]),
        "watch kubernetes",
        "SPLITBRAIN_SASL_USERNAME",
        "",
        EMPTY,
    ),
    (("leases", "relay", *DSN), "leases relay", "SPLITBRAIN_SSL_KEY_LOCATION", "", EMPTY),
    (
        ("leases", "migrate"),
        "leases migrate",
        "SPLITBRAIN_LEASES_DSN",
        "host",
        "expected a libpq connection string (host=H port=P dbname=D, or postgresql://H:P/D)",
    ),
    (("worker",), "worker", "SPLITBRAIN_METRICS_PORT", "65536", f"expected {PORT}"),
    (
        ("page", "--alertmanager-url", "http://127.0.0.1:9"),
        "page",
        "SPLITBRAIN_PAGE_RETRY_MAX_S",
        "0",
        f"expected {SECONDS}",
    ),
    (
        ("ui",),
        "ui",
        "SPLITBRAIN_UI_LISTEN",
        "localhost:8080",
        "expected an IP address and port (127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080)",
    ),
    (
        ("ui",),
        "ui",
        "SPLITBRAIN_SSL_KEY_PASSWORD",
        "",
        "expected a non-empty secret; unset the variable to use the default",
    ),
]


@pytest.mark.parametrize(("argv", "command", "variable", "value", "expected"), VARIABLES)
def test_a_bad_variable_exits_2_naming_it_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    command: str,
    variable: str,
    value: str,
    expected: str,
) -> None:
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv(variable, value)
    assert main(list(argv)) == 2
    shown = variable if "PASSWORD" in variable else f"{variable}={value!r}"
    assert capsys.readouterr().err == f"splitbrain {command}: {shown}: {expected}\n"


def test_the_kafka_connection_needs_no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "broker:9093")
    monkeypatch.setenv("SPLITBRAIN_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("SPLITBRAIN_SSL_KEY_PASSWORD", "s3cret")
    conf = KafkaConnection.from_env().client_config()
    del conf["error_cb"]
    assert conf == {
        "bootstrap.servers": "broker:9093",
        "security.protocol": "SSL",
        "ssl.key.password": "s3cret",
    }


def test_the_emitter_names_a_variable_it_cannot_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("SPLITBRAIN_SASL_MECHANISM", "")
    with pytest.raises(SettingsError) as refused:
        Emitter.from_env()
    assert str(refused.value) == f"SPLITBRAIN_SASL_MECHANISM='': {EMPTY}"
