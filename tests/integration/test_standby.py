"""Standby replicas of the kafka runtime (`--standby all`): a worker killed, its partitions taken
over by a worker that kept them warm, which reads only the changelog's tail before processing;
one killed inside its commit, whose open transaction the next owner waits out; a worker that
stalled in a revocation keeps what the next owner wrote meanwhile."""

from __future__ import annotations

import re
import signal

import pytest

from detector.devstack.worker import WorkerProcess
from detector.testing.stalling_worker import COMMIT_MARK, STALL_MARK
from tests.integration.deployment import (
    Deployment,
    assert_each_revision_once,
    audited,
    wait_for,
)
from tests.integration.test_lost_partitions import committed
from tests.integration.test_worker import event, wait_for_audit

WARM = ("--standby", "all")
WORKFLOWS = 200  # one changelog record each on partition 0: what a restore from the start reads
_RESTORED = re.compile(r"restored partitions \[([0-9, ]*)\] in [0-9.]+s: (\d+) changelog records")


def restores(w: WorkerProcess) -> list[tuple[list[int], int]]:
    """The partitions and changelog records of each restore the worker logged."""
    return [
        ([int(p) for p in match[1].split(", ") if p], int(match[2]))
        for match in _RESTORED.finditer(w.log.read_text())
    ]


def owns(w: WorkerProcess, partition: int) -> bool:
    done = restores(w)
    return bool(done) and partition in done[-1][0]


def owner_and_survivor(
    deployment: Deployment, module: str = "detector.cli"
) -> tuple[WorkerProcess, WorkerProcess]:
    """Two warm workers, started in turn and sharing the partitions: the one that owns
    partition 0, and the other."""
    first = deployment.worker("first", *WARM, module=module)
    wait_for(lambda: owns(first, 0), "the first worker to own partition 0", workers=[first])
    second = deployment.worker("second", *WARM, module=module)
    wait_for(
        lambda: bool(restores(second)) and len(restores(first)) >= 2,
        "the second worker in the group, the partitions shared",
        workers=[first, second],
    )
    return (first, second) if owns(first, 0) else (second, first)


@pytest.mark.parametrize("deployment", ["kafka", "kafka-rocksdb"], indirect=True)
def test_a_standby_takes_over_a_killed_worker_s_partition_reading_only_the_tail(
    deployment: Deployment,
) -> None:
    """The takeover of the stale workflow was processed by the killed worker alone, and its
    offsets committed: only the state the survivor's standby kept holds it, and the stale event
    published after the failover still opens its finding."""
    key = "standby-wf"
    takeover = [
        event("s1", "lease_acquired", key, 17, 1),
        event("s2", "lease_acquired", key, 18, 2),
    ]
    stale = event("s3", "progress", key, 17, 3)
    fill = [
        (f"fill-{n}".encode(), event(f"f{n}", "lease_acquired", f"fill-{n}", 1, 1))
        for n in range(WORKFLOWS)
    ]
    deployment.publish(fill, partition=0)
    owner, survivor = owner_and_survivor(deployment)
    assert owns(owner, 0) and not owns(survivor, 0)
    deployment.publish([(key.encode(), line) for line in takeover], partition=0)
    config, t = deployment.config, deployment.topics
    wait_for(
        lambda: committed(config, t.group, t.input) == WORKFLOWS + len(takeover),
        "the owner to commit the takeover",
        workers=[owner, survivor],
    )
    wait_for(
        lambda: survivor.samples("splitbrain_standby_lag_records", "partition").get("0") == 0,
        "the survivor's standby of partition 0 to catch up",
        workers=[owner, survivor],
    )
    before = len(restores(survivor))
    owner.kill()
    wait_for(
        lambda: len(restores(survivor)) > before and owns(survivor, 0),
        "the survivor to take partition 0 over once the killed worker's session expired",
        workers=[survivor],
    )
    partitions, records = restores(survivor)[-1]
    assert partitions == [0, 1, 2]
    # A restore from the start reads every fill workflow's record and the takeover's.
    assert records < WORKFLOWS, survivor.tail()
    assert "standbys' from offsets" in survivor.log.read_text()
    read = survivor.samples("splitbrain_state_restore_records_total", "")
    assert sum(read.values()) == sum(n for _, n in restores(survivor)), read

    deployment.publish([(key.encode(), stale)], partition=0)
    expected = audited([*(line for _, line in fill), *takeover, stale])
    assert len(expected) == 1
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_audit(findings, expected, [survivor])
    assert survivor.stop() == 0, survivor.tail()


@pytest.mark.parametrize("deployment", ["kafka"], indirect=True)
def test_a_worker_killed_inside_its_commit_leaves_its_batch_to_the_next_owner_once(
    deployment: Deployment,
) -> None:
    """Killed with its states written in a transaction it never commits, a worker leaves that
    transaction open on the changelog until the coordinator aborts it. The warm survivor's
    restore waits for it (the transaction might yet commit: a state read before it is decided
    could be older than the offsets resumed from), then redoes the batch from the committed
    offsets: its finding is written once."""
    key = "held-wf"
    lines = [
        event("k1", "lease_acquired", key, 17, 1),
        event("k2", "lease_acquired", key, 18, 2),
        event("k3", "progress", key, 17, 3),
    ]
    dying, survivor = owner_and_survivor(deployment, "detector.testing.stalling_worker")
    dying.signal(signal.SIGUSR2)  # its next commit stalls with its states written
    deployment.publish([(key.encode(), line) for line in lines], partition=0)
    wait_for(
        lambda: COMMIT_MARK in dying.log.read_text(),
        "the owner's transaction to hold its states",
        workers=[dying, survivor],
    )
    dying.kill()
    expected = audited(lines)
    assert len(expected) == 1
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_audit(findings, expected, [survivor])
        assert_each_revision_once(findings.records)
    assert "is undecided, waiting for it" in survivor.log.read_text(), survivor.tail()
    assert survivor.stop() == 0, survivor.tail()


@pytest.mark.parametrize("deployment", ["kafka"], indirect=True)
def test_a_worker_that_stalls_in_a_revocation_keeps_what_the_next_owner_wrote_meanwhile(
    deployment: Deployment,
) -> None:
    """Stopped inside its revocation callback past its session, a worker is out of the group
    before the callback returns: the other member owns the partitions and commits the takeover
    there. The stalled worker's warm copies must still read it (they start where its own
    restore and commits left them, not at the changelog's end it would find on waking), so
    that once it owns the workflow again the stale owner's progress opens its finding."""
    key = "stalled-wf"
    first = event("t1", "lease_acquired", key, 17, 1)
    takeover = event("t2", "lease_acquired", key, 18, 2)
    stale = event("t3", "progress", key, 17, 3)
    config, t = deployment.config, deployment.topics
    stalling = deployment.worker("stalling", *WARM, module="detector.testing.stalling_worker")
    wait_for(lambda: owns(stalling, 0), "the stalling worker to own every partition")
    stalling.signal(signal.SIGUSR1)  # its next revocation stalls
    deployment.publish([(key.encode(), first)], partition=0)
    wait_for(
        lambda: committed(config, t.group, t.input) == 1, "the first lease", workers=[stalling]
    )

    other = deployment.worker("other", *WARM)
    wait_for(
        lambda: STALL_MARK in stalling.log.read_text(), "the revocation", workers=[stalling, other]
    )
    stalling.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: owns(other, 0), "the other worker to own partition 0", workers=[other])
        deployment.publish([(key.encode(), takeover)], partition=0)
        wait_for(lambda: committed(config, t.group, t.input) == 2, "the takeover", workers=[other])
    finally:
        stalling.signal(signal.SIGCONT)
    wait_for(
        lambda: len(restores(stalling)) >= 2,
        "the stalled worker back in the group",
        workers=[stalling, other],
    )
    assert other.stop() == 0, other.tail()
    wait_for(lambda: owns(stalling, 0), "the stalled worker to own partition 0", workers=[stalling])

    deployment.publish([(key.encode(), stale)], partition=0)
    expected = audited([first, takeover, stale])
    assert len(expected) == 1
    with deployment.reader(t.findings) as findings:
        wait_for_audit(findings, expected, [stalling])
    assert stalling.stop() == 0, stalling.tail()
