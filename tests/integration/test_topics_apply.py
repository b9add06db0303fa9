"""`splitbrain topics apply` against a real broker: create, detect and fix drift, then no-op."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from detector.devstack.kafka import LocalKafka
from detector.kafka.admin import load_topics

from .kafka_harness import (
    broker_env,
    renamed_topics_file,
    splitbrain,
)

TIMEOUT = 30.0


@pytest.fixture
def topics_file(kafka_broker: LocalKafka, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    with renamed_topics_file(kafka_broker, tmp_path) as topics:
        yield topics


def broker_configs(broker: LocalKafka, topic: str) -> dict[str, str | None]:
    admin = AdminClient(broker.client_config())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    return {name: entry.value for name, entry in entries.items()}


def set_by_hand(broker: LocalKafka, topic: str, **settings: str) -> None:
    entries = [
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in settings.items()
    ]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin = AdminClient(broker.client_config())
    admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT)


def assert_broker_matches_file(broker: LocalKafka, path: Path) -> None:
    for spec in load_topics(path, "local"):
        actual = broker_configs(broker, spec.name)
        assert {k: actual[k] for k in spec.config} == dict(spec.config), spec.name
    metadata = AdminClient(broker.client_config()).list_topics(timeout=TIMEOUT)
    for spec in load_topics(path, "local"):
        assert len(metadata.topics[spec.name].partitions) == spec.partitions


def test_apply_creates_fixes_drift_and_then_changes_nothing(
    kafka_broker: LocalKafka, topics_file: tuple[Path, dict[str, str]]
) -> None:
    path, names = topics_file
    env = broker_env(kafka_broker)
    apply = ("topics", "apply", "--file", str(path), "--profile", "local")

    created = splitbrain(*apply, env=env)
    assert created.returncode == 0, created.stderr
    for name in names.values():
        assert f"create {name} partitions=6 replication_factor=1 " in created.stdout
    assert_broker_matches_file(kafka_broker, path)

    findings, dlq = names["splitbrain.findings.v1"], names["agent.ownership.dlq.v1"]
    set_by_hand(kafka_broker, findings, retention_ms="3600000")
    set_by_hand(kafka_broker, dlq, max_message_bytes="2000", cleanup_policy="compact")

    dry = splitbrain(*apply, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    drift_lines = {
        f"drift {findings} retention.ms: current=3600000 wanted=1209600000",
        f"drift {dlq} cleanup.policy: current=compact wanted=delete",
        f"drift {dlq} max.message.bytes: current=2000 wanted=4194304",
    }
    assert drift_lines <= set(dry.stdout.splitlines())
    assert "nothing changed" in dry.stdout
    assert broker_configs(kafka_broker, findings)["retention.ms"] == "3600000"

    fixed = splitbrain(*apply, env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert set(fixed.stdout.splitlines()) == {
        *drift_lines,
        "applied: 0 topic(s) to create, 3 config(s) to set",
    }
    assert_broker_matches_file(kafka_broker, path)

    again = splitbrain(*apply, env=env)
    assert (again.returncode, again.stdout, again.stderr) == (0, "no changes\n", "")
    assert_broker_matches_file(kafka_broker, path)


def test_partition_mismatch_is_reported_and_left_alone(
    kafka_broker: LocalKafka, topics_file: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, names = topics_file
    env = broker_env(kafka_broker)
    assert (
        splitbrain("topics", "apply", "--file", str(path), "--profile", "local", env=env).returncode
        == 0
    )

    spec = yaml.safe_load(path.read_text())
    spec["profiles"]["local"]["partitions"] = 3
    fewer = tmp_path / "fewer.yaml"
    fewer.write_text(yaml.safe_dump(spec))
    result = splitbrain("topics", "apply", "--file", str(fewer), "--profile", "local", env=env)

    assert result.returncode == 1
    assert result.stdout == "no changes\n"
    input_topic = names["agent.ownership.v1"]
    assert (
        f"warning: {input_topic} has 6 partitions, the file wants 3: not changed" in result.stderr
    )
    metadata = AdminClient(kafka_broker.client_config()).list_topics(timeout=TIMEOUT)
    assert len(metadata.topics[input_topic].partitions) == 6


def test_dry_run_of_an_impossible_plan_fails_and_creates_nothing(
    kafka_broker: LocalKafka, topics_file: tuple[Path, dict[str, str]]
) -> None:
    """Without the local profile the file wants 3 replicas; a one-node broker must say no."""
    path, names = topics_file
    result = splitbrain(
        "topics", "apply", "--file", str(path), "--dry-run", env=broker_env(kafka_broker)
    )
    assert result.returncode == 2
    assert "replication factor" in result.stderr
    existing = AdminClient(kafka_broker.client_config()).list_topics(timeout=TIMEOUT).topics
    assert not set(names.values()) & set(existing)
