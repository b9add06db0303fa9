"""`splitbrain worker --processing-guarantee at-least-once` against a real broker: no Kafka
transaction anywhere, yet the findings topic ends with the revisions `audit` computes; and a
kill -9 in the middle of the stream loses none of them, though it may write some again.

Only the kafka runtime has this mode; each test owns fresh topics and a fresh consumer group.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable

import pytest
from confluent_kafka import IsolationLevel
from confluent_kafka.admin import AdminClient

from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import (
    Record,
    end_offsets,
    lagging_partitions,
    quiescent,
    read_committed,
)
from detector.devstack.worker import WorkerProcess
from tests.integration.deployment import (
    Deployment,
    audited,
    fixture_lines,
    keyed,
    latest,
    wait_for,
)
from tests.integration.test_topics_apply import set_by_hand
from tests.integration.test_worker import (
    POISON,
    assert_exactly_once,
    many_workflows,
    trickle,
    wait_for_audit,
    wait_for_findings,
)

pytestmark = pytest.mark.parametrize("deployment", ["kafka"], indirect=True)

AT_LEAST_ONCE = ("--processing-guarantee", "at-least-once")


def test_at_least_once_gives_what_audit_gives_without_transactions(
    deployment: Deployment,
) -> None:
    lines = fixture_lines()
    w = deployment.worker("w1", *AT_LEAST_ONCE)
    deployment.publish([*keyed(lines), (b"export-ledger", POISON)])
    with deployment.reader(deployment.topics.findings) as findings:
        # Nothing failed, so nothing was written twice.
        assert_exactly_once(deployment, findings, audited(lines), [w])
        records = findings.records
    dead = read_committed(deployment.config, deployment.topics.dlq)
    assert [(d.key, d.value) for d in dead] == [(b"export-ledger", POISON)]
    admin = AdminClient(deployment.config)
    # A transaction's commit marker takes an offset: without transactions, every offset of the
    # outputs is a record.
    for topic, written in ((deployment.topics.findings, records), (deployment.topics.dlq, dead)):
        assert sum(end_offsets(admin, topic, IsolationLevel.READ_UNCOMMITTED).values()) == len(
            written
        ), topic
    # A commit is a flush and an offset commit, counted as a transaction.
    outcomes = w.samples("splitbrain_transactions_total", "outcome")
    assert outcomes.get("committed", 0) >= 1 and not outcomes.get("aborted"), outcomes
    assert w.stop() == 0, w.tail()  # SIGTERM: flush, commit, leave the group


def test_sigkill_mid_stream_loses_no_revision(deployment: Deployment) -> None:
    """kill -9 mid-stream, restart: what was written since the last offset commit may be
    written again, but every finding ends at audit's revision, with none skipped."""
    w = deployment.worker("w1", *AT_LEAST_ONCE)
    before, records = through_a_fault(deployment, w, lambda: killed_and_restarted(w))
    assert len(before) < len(records), "the kill came after all the work"


def test_a_kill_before_any_commit_writes_that_output_again(deployment: Deployment) -> None:
    """A worker that commits only when stopped, killed: nothing it wrote was committed, so the
    restarted worker writes every revision of it again — at least once, not exactly once."""
    only_at_stop = ("--commit-interval-ms", "3600000", "--commit-max-events", "1000000")
    w = deployment.worker("w1", *AT_LEAST_ONCE, *only_at_stop)
    before, records = through_a_fault(deployment, w, lambda: killed_and_restarted(w))
    written = Counter(pair(r) for r in records)
    assert all(written[pair(r)] >= 2 for r in before), "a revision was not written again"


def test_scale_out_commits_on_the_rebalance(deployment: Deployment) -> None:
    """A second worker joins mid-stream: the first commits what it did when its partitions are
    revoked, the second restores their state from the changelog, and nothing is lost."""
    a = deployment.worker("a", *AT_LEAST_ONCE)
    joined: list[WorkerProcess] = []

    def scale_out() -> list[WorkerProcess]:
        joined.append(deployment.worker("b", *AT_LEAST_ONCE))
        return [a, *joined]

    through_a_fault(deployment, a, scale_out)
    assert "finding " in joined[0].log.read_text(), "the second worker never got a partition"
    assert "commit during rebalance failed" not in a.log.read_text(), a.tail()


def test_a_failed_delivery_commits_no_offset_past_it(
    deployment: Deployment, kafka_broker: LocalKafka
) -> None:
    """The findings topic refuses every revision for a while: the worker commits no offset past
    them, rebuilds and retries from the committed ones; once the topic takes them, none is
    missing."""
    w = deployment.worker("w1", *AT_LEAST_ONCE)
    wait_for(lambda: "restored partitions" in w.log.read_text(), "the start", workers=[w])
    set_by_hand(kafka_broker, deployment.topics.findings, max_message_bytes="100")
    lines = fixture_lines()
    deployment.publish(keyed(lines))

    def failures() -> int:
        return w.log.read_text().count("transaction failed, aborting and rebuilding")

    wait_for(lambda: failures() >= 2, "failed deliveries, twice", workers=[w])
    admin = AdminClient(deployment.config)
    assert lagging_partitions(admin, deployment.topics), "offsets committed past lost revisions"
    set_by_hand(kafka_broker, deployment.topics.findings, max_message_bytes=str(1 << 20))
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_audit(findings, audited(lines), [w])
        assert_no_revision_missing(findings.records)
    assert w.stop() == 0, w.tail()


def killed_and_restarted(w: WorkerProcess) -> list[WorkerProcess]:
    w.kill()  # no rebalance callback: nothing is flushed or committed
    return [w.start()]


def through_a_fault(
    deployment: Deployment, first: WorkerProcess, fault: Callable[[], list[WorkerProcess]]
) -> tuple[list[Record], list[Record]]:
    """Many workflows published in the background; once `first` wrote some revisions, `fault`
    returns the workers that finish the stream. Their revisions end as audit's, none skipped,
    and stopping them (SIGTERM: flush, then commit) commits the whole input. The revisions read
    before the fault, and all of them."""
    lines = many_workflows(150)
    expected = audited(lines)
    sender = trickle(deployment, lines)
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_findings(findings, 60, first)
        before = list(findings.records)
        finishing = fault()
        sender.join(timeout=60)
        assert not sender.is_alive()
        wait_for_audit(findings, expected, finishing)
        for w in reversed(finishing):
            assert w.stop() == 0, w.tail()
        assert quiescent(AdminClient(deployment.config), deployment.topics)
        findings.read_to_end()
    assert latest(findings.records) == expected
    assert_no_revision_missing(findings.records)
    return before, findings.records


def pair(record: Record) -> tuple[str, int]:
    doc = json.loads(record.value)
    return doc["finding_id"], doc["revision"]


def assert_no_revision_missing(records: Iterable[Record]) -> None:
    """Each finding's revisions are 1, 2, … with none skipped; a pair may be there twice."""
    by_id: dict[str, set[int]] = {}
    for finding_id, revision in map(pair, records):
        by_id.setdefault(finding_id, set()).add(revision)
    for fid, revisions in by_id.items():
        assert revisions == set(range(1, max(revisions) + 1)), f"{fid}: revisions {revisions}"
