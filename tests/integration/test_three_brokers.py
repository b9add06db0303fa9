"""The production topology: topics/topics.yaml's default profile (replication 3, min ISR 2) on a
three-broker cluster, and the pager bridge and the lease store's relay with a broker killed."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)
from psycopg.rows import DictRow

from detector.devstack.kafka_cluster import LocalKafkaCluster
from detector.devstack.topics import create_topics
from detector.devstack.worker import WorkerProcess
from detector.kafka.health import TRANSACTION_TOPICS, serves
from detector.testing.pagerduty import PagerDutyReceiver
from detector.testing.torture.harness import STALL_LINE

from .deployment import PARTITIONS as INPUT_PARTITIONS
from .deployment import Deployment, audited, keyed, wait_for
from .kafka_harness import broker_env, renamed_topics_file, splitbrain
from .test_outbox_relay import relay_through
from .test_page_bridge import KEY, REVS, BridgeProcess, publish, settled, until, variant
from .test_worker import assert_exactly_once, many_workflows, wait_for_findings

TIMEOUT = 30.0
GIVE_UP_LINE = b"giving up: a commit has waited"  # what detector.runtime.stall logs
PARTITIONS = 3
FINDINGS = 30
COPIES = 400  # of the fixture's workflows, for the stall test


def test_default_profile_applies_and_then_has_nothing_to_change(
    kafka_cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    env = broker_env(kafka_cluster)
    with renamed_topics_file(kafka_cluster, tmp_path) as (path, names):
        first = splitbrain("topics", "apply", "--file", str(path), env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "applied: 4 topic(s) to create, 0 config(s) to set" in first.stdout
        for name in names.values():  # a new topic reaches the brokers one by one
            kafka_cluster.wait_topic(name, timeout=120)

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


def test_the_pager_bridge_loses_and_repeats_no_page_when_a_broker_dies(
    kafka_cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    """Findings keep coming while the leader of the bridge's state topic is killed: every
    finding's incident ends at its last revision, and no revision is sent to PagerDuty twice."""
    config = kafka_cluster.client_config()
    topic = f"it-page-findings-{uuid.uuid4().hex[:8]}"
    replicated_topic(kafka_cluster, topic, PARTITIONS)
    findings = [
        [variant(f, f"sb-3b-{n}", f"tenant-{n}/job") for f in REVS[:3]] for n in range(FINDINGS)
    ]
    with PagerDutyReceiver(KEY) as pd:
        bridge = BridgeProcess(
            config,
            topic,
            tmp_path,
            sinks=("--pagerduty-url", pd.url),
            env={"SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": KEY},
        )
        try:
            bridge.start()
            publish(config, topic, *(f for revs in findings for f in revs[:2]))
            until(lambda: len(pd.incidents) == FINDINGS, "an incident per finding", bridge)
            victim = kafka_cluster.leader(bridge.state_topic, 0)
            kafka_cluster.node(victim).kill()
            publish(config, topic, *(revs[2] for revs in findings))
            kafka_cluster.restart(victim)
            until(lambda: settled(bridge), "every finding delivered and committed", bridge)
            assert bridge.stop() == 0
        finally:
            bridge.kill()
        sent = Counter(
            (e["dedup_key"], e["event_action"], e["payload"]["custom_details"]["revision"])
            for e in pd.accepted()
        )
    assert [event for event, times in sent.items() if times > 1] == []
    for revs in findings:
        incident = pd.incident(revs[-1].finding_id)
        assert incident is not None
        assert incident.opened == 1
        details = incident.events[-1]["payload"]["custom_details"]
        assert details["revision"] == revs[-1].revision, revs[-1].finding_id


def test_the_relay_loses_no_row_and_republishes_none_when_a_broker_dies(
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    kafka_cluster: LocalKafkaCluster,
) -> None:
    """The lease store's relay publishes while the leader of its topic's partition 0 is killed
    (and stays down): every outbox row is on the topic once, under its own event id."""
    topic = f"it-relay-{uuid.uuid4().hex[:8]}"
    replicated_topic(kafka_cluster, topic, PARTITIONS)

    def kill_a_leader() -> None:
        kafka_cluster.node(kafka_cluster.leader(topic, 0)).kill()

    relay_through(postgres_dsn, kafka_cluster, topic, kill_a_leader)


def test_the_kafka_worker_stalls_with_two_brokers_down_and_commits_again_after(
    kafka_cluster: LocalKafkaCluster, tmp_path: Path
) -> None:
    """Two brokers of three killed while transactions run, the coordinator of the worker's
    transactions among them: `min.insync.replicas` cannot be met, so the worker commits nothing
    and says so. Once the other broker returns, it commits again (`resumed`); readers see each
    revision once, the latest equal to audit's."""
    d = Deployment(kafka_cluster, tmp_path, "kafka", "memory", replication=3)
    try:
        lines = many_workflows(COPIES)
        held = lines[-(len(lines) // COPIES) :]  # whole workflows: the fixture's last copy
        expected = audited(lines)
        w = d.worker()
        wait_for(lambda: "restored partitions" in w.log.read_text(), "the start", workers=[w])
        coordinator = kafka_cluster.transaction_coordinator(f"{d.topics.group}-{w.instance}")
        sender, unsent = publish_through_an_outage(d, lines[: -len(held)])
        with d.reader(d.topics.findings) as findings:
            wait_for_findings(findings, 60, w)
            other = kill_two_with_input_waiting(kafka_cluster, d, w, coordinator, held)
            wait_for(lambda: STALL_LINE in w.log.read_bytes(), "the stall said", workers=[w])
            # What the stall watch asks before it ends a commit past its timeout: not served.
            needs = [d.topics.findings, *TRANSACTION_TOPICS]
            assert not serves(AdminClient(d.config), needs)
            stalled = committed(w)
            kafka_cluster.restart(other)
            resumed(d, w, stalled)
            wait_for(lambda: serves(AdminClient(d.config), needs), "served again", workers=[w])
            kafka_cluster.restart(coordinator)
            sender.join(timeout=300)
            assert not sender.is_alive() and unsent == [0]
            assert_exactly_once(d, findings, expected, [w])
        assert w.stop() == 0, w.tail()
    finally:
        d.close()


def kill_two_with_input_waiting(
    kafka_cluster: LocalKafkaCluster,
    d: Deployment,
    w: WorkerProcess,
    coordinator: int,
    held: list[bytes],
) -> int:
    """Kill `coordinator` and another broker (returned) while `held` waits for `w` on a partition
    the third leads, so that `w` has a transaction to commit when they are gone. A worker whose
    brokers die between two of its batches has nothing to commit (its input cannot be written
    without two brokers) and rightly says nothing: seen once in CI (2026-12-06). `w` is paused
    meanwhile, so that it cannot commit `held` before the brokers die."""
    leaders = {p: kafka_cluster.leader(d.topics.input, p) for p in range(INPUT_PARTITIONS)}
    led = [
        (n, p) for p, n in sorted(leaders.items()) if n in kafka_cluster.nodes and n != coordinator
    ]
    assert led, f"node {coordinator} leads every input partition: {leaders}"
    survivor, partition = led[0]
    other = next(n for n in sorted(kafka_cluster.nodes) if n not in (coordinator, survivor))
    w.signal(signal.SIGSTOP)
    try:
        d.publish(keyed(held), partition=partition)
        for node_id in (coordinator, other):
            kafka_cluster.node(node_id).kill()
    finally:
        w.signal(signal.SIGCONT)
    return other


def resumed(d: Deployment, w: WorkerProcess, stalled: float) -> None:
    """Until `w` commits again: the same process, or the next one when its commit outlived its
    own timeout with the cluster serving again, the client lost to its coordinator (librdkafka
    #5456; seen once in five CI runs): the stall watch's rule then ends it (status 1) for its
    supervisor, here the test, to start a fresh one, whose transactional id fences the open
    transaction."""
    wait_for(lambda: not w.alive() or committed(w) > stalled, "a commit, or the give-up")
    if w.alive():
        return
    assert w.exit_code() == 1 and GIVE_UP_LINE in w.log.read_bytes(), w.tail()
    d.worker(w.instance)
    wait_for(lambda: committed(w) > 0, "a commit, by the next process", workers=[w])


def committed(w: WorkerProcess) -> float:
    return w.samples("splitbrain_transactions_total", "outcome").get("committed", 0.0)


def publish_through_an_outage(
    d: Deployment, lines: list[bytes]
) -> tuple[threading.Thread, list[int]]:
    """Publish from a thread, slowly enough to span the faults; what the outage holds up waits
    in the producer. The list gets what was left unsent at the end."""
    unsent: list[int] = []

    def send() -> None:
        producer = Producer({**d.config, "enable.idempotence": True, "message.timeout.ms": 600_000})
        records = keyed(lines)
        for i in range(0, len(records), 16):
            for key, value in records[i : i + 16]:
                producer.produce(d.topics.input, key=key, value=value)
            producer.poll(0)
            time.sleep(0.1)
        unsent.append(producer.flush(300))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender, unsent


def replicated_topic(cluster: LocalKafkaCluster, name: str, partitions: int) -> None:
    """A topic as the default profile makes them: replication 3, `min.insync.replicas` 2."""
    new = NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})
    create_topics(cluster.client_config(), [new], TIMEOUT)
    cluster.wait_topic(name)
