"""The production topology: topics/topics.yaml's default profile (replication 3, min ISR 2) on a
three-broker cluster, and the pager bridge and the lease store's relay with a broker killed."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from detector.testing.kafka_cluster import LocalKafkaCluster

from .kafka_harness import broker_env, renamed_topics_file, splitbrain

TIMEOUT = 30.0


def test_default_profile_applies_and_then_has_nothing_to_change(
    kafka_cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    env = broker_env(kafka_cluster)
    with renamed_topics_file(kafka_cluster, tmp_path) as (path, names):
        first = splitbrain("topics", "apply", "--file", str(path), env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "applied: 4 topic(s) to create, 0 config(s) to set" in first.stdout

        admin = AdminClient(kafka_cluster.client_config())
        metadata = admin.list_topics(timeout=TIMEOUT)
        for name in names.values():
            partitions = metadata.topics[name].partitions.values()
            assert {len(p.replicas) for p in partitions} == {3}, name
            resource = ConfigResource(ConfigResource.Type.TOPIC, name)
            configs = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
            assert configs["min.insync.replicas"].value == "2", name

        second = splitbrain("topics", "apply", "--file", str(path), env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert second.stdout.strip() == "no changes"
