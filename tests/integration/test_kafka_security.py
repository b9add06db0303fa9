"""Every Kafka command over SASL_SSL + SCRAM-SHA-512 with the broker's own CA, and wrong
credentials or a wrong CA end at once with the reason, not in a timeout that names none."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from detector.contracts.events import parse_event_json
from detector.contracts.findings import Finding
from detector.devstack.kafka import LocalKafka, make_tls_files
from detector.histories.audit import audit_lines
from detector.kafka.config import KafkaClientError, env_name
from detector.kafka.emit import DEFAULT_FLUSH_TIMEOUT, Emitter
from detector.kafka.findings import METADATA_TIMEOUT
from tests.paths import SEED_FIXTURE

from .kafka_harness import (
    OwnerFields,
    broker_env,
    read_topic,
    renamed_topics_file,
    splitbrain,
    unique,
)

TIMEOUT = 30.0
# The shortest wait the commands and the emitter could end in instead (metadata, a flush): one
# that ends on the error comes before it, however loaded the machine; one that waits, after.
WAITED_OUT = min(METADATA_TIMEOUT, DEFAULT_FLUSH_TIMEOUT)


@pytest.fixture
def secure_topics(
    kafka_sasl_broker: LocalKafka, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    with renamed_topics_file(kafka_sasl_broker, tmp_path) as topics:
        yield topics


def password_file_env(broker: LocalKafka, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The broker's settings as environment, except the password, which goes in a file."""
    secret = tmp_path / "sasl-password"
    secret.write_text(broker.sasl_password + "\n")
    secret.chmod(0o600)
    env = broker_env(broker)
    del env[env_name("sasl.password")]
    return env, secret


def test_apply_emit_replay_and_tail_over_sasl_ssl(
    kafka_sasl_broker: LocalKafka, secure_topics: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, names = secure_topics
    ownership, findings = names["agent.ownership.v1"], names["splitbrain.findings.v1"]
    env, secret = password_file_env(kafka_sasl_broker, tmp_path)
    assert env[env_name("security.protocol")] == "SASL_SSL"
    password = ("--sasl-password-file", str(secret))

    apply = splitbrain(
        "topics", "apply", "--file", str(path), "--profile", "local", *password, env=env
    )
    assert apply.returncode == 0, apply.stderr
    assert apply.stdout.count("create ") == len(names)  # every topic of the file

    owner: OwnerFields = {"workflow_key": "wf-secure", "owner_epoch": 4, "worker_id": "w-secure"}
    with Emitter(kafka_sasl_broker.client_config(), topic=ownership) as emitter:
        sent = [emitter.lease_acquired(**owner, seq=1), emitter.progress(**owner, seq=2)]
    replay = splitbrain(
        "replay",
        "-",
        "--topic",
        ownership,
        *password,
        env=env,
        stdin="job_claimed job=wf-legacy token=9 worker=w1 seq=3\n",
    )
    assert replay.returncode == 0, replay.stderr
    got = [parse_event_json(m.value) for m in read_topic(kafka_sasl_broker, ownership, 3)]
    assert sorted(e.event_id for e in got) == sorted([*(e.event_id for e in sent), "line-1"])

    (finding,) = audit_lines(SEED_FIXTURE.read_bytes().splitlines()).findings.values()
    producer = Producer(kafka_sasl_broker.client_config())
    producer.produce(findings, finding.to_json(), finding.workflow_key)
    assert producer.flush(TIMEOUT) == 0
    tail = splitbrain(
        "tail",
        "--from-beginning",
        "--format",
        "json",
        "--idle-timeout",
        "1",
        "--topic",
        findings,
        *password,
        env=env,
    )
    assert tail.returncode == 0, tail.stderr
    assert [Finding.model_validate_json(line) for line in tail.stdout.splitlines()] == [finding]


@pytest.fixture(params=["sasl.password", "ssl.ca.location"])
def wrong_setting(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, str]:
    """A wrong password, or a CA that did not sign the broker's certificate: (setting, value,
    what the error must say)."""
    if request.param == "sasl.password":
        return "sasl.password", "not-the-password", "SASL authentication error"
    stranger = make_tls_files(tmp_path / "other-ca").ca_cert
    return "ssl.ca.location", str(stranger), "certificate verify failed"


@pytest.mark.parametrize("command", ["topics apply --profile local", "tail", "replay -"])
def test_wrong_credentials_fail_fast_with_the_reason(
    kafka_sasl_broker: LocalKafka, command: str, wrong_setting: tuple[str, str, str]
) -> None:
    setting, value, reason = wrong_setting
    env = broker_env(kafka_sasl_broker, **{env_name(setting): value})
    event = {"event_id": "e1", "kind": "progress", "workflow_key": "wf", "owner_epoch": 1}
    history = json.dumps({**event, "worker_id": "w"}) + "\n"
    started = time.monotonic()
    result = splitbrain(*command.split(), env=env, stdin=history)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    name = command.removesuffix(" --profile local").removesuffix(" -")
    assert f"splitbrain {name}: Kafka: " in result.stderr
    assert reason in result.stderr
    assert "within" not in result.stderr  # what a timeout says
    assert elapsed < WAITED_OUT


def test_emitter_with_wrong_password_fails_quickly(kafka_sasl_broker: LocalKafka) -> None:
    conf = {**kafka_sasl_broker.client_config(), "sasl.password": "not-the-password"}
    started = time.monotonic()
    with (
        pytest.raises(KafkaClientError, match="SASL authentication error"),
        Emitter(conf, topic=unique("never-reached")) as emitter,
    ):
        emitter.progress(workflow_key="wf", owner_epoch=1, worker_id="w")
    assert time.monotonic() - started < WAITED_OUT
