"""`splitbrain tail` shows only what the detector committed, latest revision per finding."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from detector.contracts.findings import Finding, Severity
from detector.devstack.kafka import LocalKafka
from detector.histories.audit import audit_lines
from tests.paths import SEED_FIXTURE

from .kafka_harness import broker_env, create_topic, delete_topics, splitbrain, unique

TIMEOUT = 30.0


def seed_finding() -> Finding:
    """A real finding, from the engine, to derive the test's revisions from."""
    (finding,) = audit_lines(SEED_FIXTURE.read_bytes().splitlines()).findings.values()
    return finding


def revision(finding_id: str, workflow: str, rev: int, severity: Severity) -> Finding:
    return seed_finding().model_copy(
        update={
            "finding_id": finding_id,
            "workflow_key": workflow,
            "revision": rev,
            "severity": severity,
        }
    )


def publish(
    producer: Producer, topic: str, records: list[Finding | bytes], *, commit: bool
) -> None:
    producer.begin_transaction()
    for record in records:
        if isinstance(record, Finding):
            producer.produce(topic, record.to_json(), record.workflow_key)
        else:
            producer.produce(topic, record, b"garbage")
    producer.flush(TIMEOUT)  # the aborted records really are in the log, not just dropped
    if commit:
        producer.commit_transaction(TIMEOUT)
    else:
        producer.abort_transaction(TIMEOUT)


@pytest.fixture(scope="module")
def findings_topic(kafka_broker: LocalKafka) -> Iterator[str]:
    """Committed: A rev 1, C rev 1, a broken record, A rev 2. Aborted: A rev 5 and B rev 1."""
    topic = create_topic(kafka_broker, unique("test-findings"), 3)
    producer = Producer(
        {**kafka_broker.client_config(), "transactional.id": unique("test-detector")}
    )
    producer.init_transactions(TIMEOUT)
    publish(
        producer,
        topic,
        [
            revision("fA", "wf-a", 1, Severity.WARNING),
            revision("fC", "wf-c", 1, Severity.INFO),
            b"{not a finding",
        ],
        commit=True,
    )
    publish(
        producer,
        topic,
        [
            revision("fA", "wf-a", 5, Severity.CRITICAL),
            revision("fB", "wf-b", 1, Severity.CRITICAL),
        ],
        commit=False,
    )
    publish(producer, topic, [revision("fA", "wf-a", 2, Severity.CRITICAL)], commit=True)
    yield topic
    delete_topics(kafka_broker, [topic])


def tail(broker: LocalKafka, topic: str, options: str) -> tuple[str, str]:
    result = splitbrain(
        "tail", *options.split(), "--idle-timeout", "2", "--topic", topic, env=broker_env(broker)
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def test_json_prints_the_latest_committed_revision_of_each_finding(
    kafka_broker: LocalKafka, findings_topic: str
) -> None:
    out, err = tail(kafka_broker, findings_topic, "--from-beginning --format json")
    latest = {f.finding_id: f for f in map(Finding.model_validate_json, out.splitlines())}
    assert {fid: (f.revision, f.severity) for fid, f in latest.items()} == {
        "fA": (2, Severity.CRITICAL),
        "fC": (1, Severity.INFO),
    }
    assert latest["fA"] == revision("fA", "wf-a", 2, Severity.CRITICAL)
    (skipped,) = [line for line in err.splitlines() if line.startswith("skipped ")]
    assert skipped.startswith(f"skipped {findings_topic}[")


def test_text_prints_each_committed_revision_then_a_report(
    kafka_broker: LocalKafka, findings_topic: str
) -> None:
    out, _ = tail(kafka_broker, findings_topic, "--from-beginning")
    live, _, report = out.partition("\nsplitbrain tail: ")
    revisions = [line.split()[1:5] for line in live.splitlines() if line]
    assert sorted(revisions) == [
        ["wf-a", "fA", "rev", "1"],
        ["wf-a", "fA", "rev", "2"],
        ["wf-c", "fC", "rev", "1"],
    ]
    assert [r[3] for r in revisions if r[1] == "fA"] == ["1", "2"]  # in order, as they came
    assert report.startswith(
        f"4 record(s) from {findings_topic}, 2 finding(s), 1 invalid record(s) skipped\n"
    )
    assert "  fA rev 2, open, confidence high, ordering authoritative_seq, sink committed" in report
    assert "wf-b" not in out


def test_group_mode_resumes_where_the_group_left_off(
    kafka_broker: LocalKafka, findings_topic: str
) -> None:
    options = f"--group-id {unique('test-tail-group')} --from-beginning --format json"
    first, _ = tail(kafka_broker, findings_topic, options)
    assert sorted(json.loads(line)["finding_id"] for line in first.splitlines()) == ["fA", "fC"]
    second, _ = tail(kafka_broker, findings_topic, options)
    assert second == ""


def test_missing_topic_is_a_clear_error(kafka_broker: LocalKafka) -> None:
    missing = unique("no-such-findings")
    result = splitbrain("tail", "--topic", missing, env=broker_env(kafka_broker))
    assert result.returncode == 2
    assert f"splitbrain tail: cannot read topic {missing}: " in result.stderr
