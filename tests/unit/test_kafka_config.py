"""Kafka client settings from flags, environment and files; secrets never from a flag value."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from detector.cli import topics
from detector.cli.main import main
from detector.contracts.events import EventError
from detector.errors import ExitCode
from detector.kafka.admin import TopicsFileError, load_topics
from detector.kafka.config import (
    KafkaClientError,
    KafkaConnection,
    add_kafka_arguments,
    raise_unrecoverable,
)
from detector.kafka.emit import Emitter
from detector.settings import ENV_PREFIX, SettingsError

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = "broker-1:9093,broker-2:9093"


@pytest.fixture(autouse=True)
def _only_the_tests_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the `SPLITBRAIN_` variables a test sets, not those of the shell running it."""
    for name in os.environ:
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="test")
    add_kafka_arguments(parser)
    return parser.parse_args(argv)


def config(*argv: str, **env: str) -> dict[str, object]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        conf = KafkaConnection.from_args(parse(*argv)).client_config()
    assert conf.pop("error_cb") is raise_unrecoverable
    return conf


def test_flags_become_librdkafka_settings() -> None:
    conf = config(
        "--bootstrap-servers",
        BOOTSTRAP,
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--sasl-username",
        "alice",
        "--ssl-ca-location",
        "/etc/kafka/ca.pem",
        "--ssl-certificate-location",
        "/etc/kafka/client.pem",
        "--ssl-key-location",
        "/etc/kafka/client.key",
        "--ssl-endpoint-identification-algorithm",
        "none",
        SPLITBRAIN_SASL_PASSWORD="s3cret",
    )
    assert conf == {
        "bootstrap.servers": BOOTSTRAP,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.certificate.location": "/etc/kafka/client.pem",
        "ssl.key.location": "/etc/kafka/client.key",
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_environment_fills_in_and_flags_win() -> None:
    conf = config(
        "--security-protocol",
        "SSL",
        SPLITBRAIN_BOOTSTRAP_SERVERS=BOOTSTRAP,
        SPLITBRAIN_SECURITY_PROTOCOL="SASL_SSL",
        SPLITBRAIN_SSL_CA_LOCATION="/ca.pem",
        SPLITBRAIN_SSL_KEY_PASSWORD="keypass",
    )
    assert conf == {
        "bootstrap.servers": BOOTSTRAP,
        "security.protocol": "SSL",
        "ssl.ca.location": "/ca.pem",
        "ssl.key.password": "keypass",
    }


def test_no_bootstrap_servers_is_a_clear_error() -> None:
    with pytest.raises(KafkaClientError, match="SPLITBRAIN_BOOTSTRAP_SERVERS"):
        KafkaConnection.from_args(parse()).client_config()


def test_username_without_password_is_refused_before_connecting() -> None:
    with pytest.raises(KafkaClientError, match="SPLITBRAIN_SASL_PASSWORD"):
        config("--bootstrap-servers", BOOTSTRAP, "--sasl-username", "alice")


@pytest.mark.parametrize(
    "argv",
    [
        ("--sasl-password", "hunter2"),
        ("--sasl-password=hunter2",),
        ("--ssl-key-password", "hunter2"),
    ],
)
def test_secrets_are_not_accepted_as_flags(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--bootstrap-servers", BOOTSTRAP, *argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "not accepted" in err
    assert "-file" in err
    assert "hunter2" not in err


def test_password_file_wins_over_env_and_loses_its_newline(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    conf = config(
        "--bootstrap-servers",
        BOOTSTRAP,
        "--sasl-username",
        "alice",
        "--sasl-password-file",
        str(secret),
        SPLITBRAIN_SASL_PASSWORD="from-env",
    )
    assert conf["sasl.password"] == "from-file"


def test_unreadable_password_file_names_the_flag_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SettingsError, match=f"cannot read --sasl-password-file {missing}: "):
        config("--bootstrap-servers", BOOTSTRAP, "--sasl-password-file", str(missing))


@pytest.mark.parametrize(
    ("argv", "env", "problem"),
    [
        (
            (),
            {"SPLITBRAIN_SSL_CA_LOCATION": ""},
            "SPLITBRAIN_SSL_CA_LOCATION='': expected a non-empty value; "
            "unset the variable to use the default",
        ),
        (("--sasl-username", ""), {}, "--sasl-username='': expected a non-empty value"),
        (
            (),
            {"SPLITBRAIN_SASL_PASSWORD": ""},
            "SPLITBRAIN_SASL_PASSWORD: expected a non-empty secret; "
            "unset the variable to use the default",
        ),
        (
            ("--sasl-password-file", "/dev/null"),
            {"SPLITBRAIN_SASL_PASSWORD": "not-empty"},
            "--sasl-password-file: expected a non-empty secret",
        ),
    ],
)
def test_an_empty_value_is_refused_by_the_name_it_came_from(
    argv: tuple[str, ...], env: dict[str, str], problem: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        config("--bootstrap-servers", BOOTSTRAP, *argv, **env)
    assert str(refused.value) == problem


def test_error_callback_raises_only_what_retrying_cannot_fix() -> None:
    raise_unrecoverable(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    raise_unrecoverable(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    with pytest.raises(KafkaClientError, match="invalid credentials"):
        raise_unrecoverable(KafkaError(KafkaError._AUTHENTICATION, "invalid credentials"))
    with pytest.raises(KafkaClientError, match="certificate verify failed"):
        raise_unrecoverable(KafkaError(KafkaError._SSL, "certificate verify failed"))
    with pytest.raises(KafkaClientError, match="fenced"):
        raise_unrecoverable(KafkaError(KafkaError._FENCED, "fenced", fatal=True))


def test_commands_report_kafka_errors_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "No such property: x"))

    def misconfigured(args: argparse.Namespace) -> int:
        raise SettingsError("SPLITBRAIN_A='': expected a\n--b='x': expected b")

    monkeypatch.setattr(topics, "run_apply", broken)
    assert main(["topics", "apply"]) == ExitCode.UNUSABLE
    assert capsys.readouterr().err == "splitbrain topics apply: No such property: x\n"
    monkeypatch.setattr(topics, "run_apply", misconfigured)
    assert main(["topics", "apply"]) == ExitCode.UNUSABLE
    assert capsys.readouterr().err == (
        "splitbrain topics apply: SPLITBRAIN_A='': expected a\n"
        "splitbrain topics apply: --b='x': expected b\n"
    )


def test_emitter_validates_before_sending() -> None:
    with Emitter({"bootstrap.servers": "127.0.0.1:1"}) as emitter:
        with pytest.raises(EventError, match="owner_epoch"):
            emitter.emit(kind="progress", workflow_key="wf", owner_epoch=-1, worker_id="w")
        with pytest.raises(EventError, match="effect_key"):
            emitter.emit(
                {
                    "kind": "effect_committed",
                    "workflow_key": "wf",
                    "owner_epoch": 1,
                    "worker_id": "w",
                }
            )
        assert emitter.sent == 0


def test_topics_file_profile_overrides_partitions_replication_and_config() -> None:
    prod = {t.name: t for t in load_topics(REPO / "topics" / "topics.yaml")}
    local = {t.name: t for t in load_topics(REPO / "topics" / "topics.yaml", "local")}
    assert set(prod) == {
        "agent.ownership.v1",
        "splitbrain.findings.v1",
        "agent.ownership.dlq.v1",
        "splitbrain.page-state.v1",
    }
    for name, topic in local.items():
        assert (topic.replication_factor, topic.config["min.insync.replicas"]) == (1, "1")
        compacted = name == "splitbrain.page-state.v1"  # the pager bridge's state, never expired
        assert topic.config["cleanup.policy"] == ("compact" if compacted else "delete")
        assert {k: v for k, v in topic.config.items() if k != "min.insync.replicas"} == {
            k: v for k, v in prod[name].config.items() if k != "min.insync.replicas"
        }
    assert prod["splitbrain.findings.v1"].partitions == prod["agent.ownership.v1"].partitions
    assert prod["splitbrain.findings.v1"].config["retention.ms"] == str(14 * 24 * 3600 * 1000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "partitions: 1\nreplication_factor: 1\ntopics: {t: {min.insync.replicas: 2}}\n",
            "min.insync.replicas 2 > replication factor 1",
        ),
        ("partitions: 0\nreplication_factor: 1\ntopics: {}\n", "partitions"),
        ("partitions: 1\nreplication_factor: 1\ntopics: {}\nextra: 1\n", "extra"),
        ("partitions: [\n", "not YAML"),
    ],
)
def test_unusable_topics_files_say_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "topics.yaml"
    path.write_text(text)
    with pytest.raises(TopicsFileError, match=message):
        load_topics(path)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(TopicsFileError, match="profiles: local"):
        load_topics(REPO / "topics" / "topics.yaml", "staging")


def test_emitter_from_env_needs_only_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPLITBRAIN_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(KafkaClientError, match="SPLITBRAIN_BOOTSTRAP_SERVERS"):
        Emitter.from_env()
    monkeypatch.setenv("SPLITBRAIN_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    with Emitter.from_env(topic="elsewhere") as emitter:
        assert emitter.topic == "elsewhere"
