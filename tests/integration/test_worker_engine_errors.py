"""An exception of the engine on one event costs that event, never its partition, in both
runtimes against a real broker: a worker whose engine raises on one workflow's event
(`detector.testing.faulty_worker`) dead-letters it with the reason, counts it, marks the
workflow, and goes on; a restart does not meet the event again."""

from __future__ import annotations

import json

from confluent_kafka.admin import AdminClient

from detector.devstack.topics import Record, quiescent, read_committed
from detector.devstack.worker import WorkerProcess
from detector.testing.faulty_worker import FAULT_EVENT_ID
from tests.integration.deployment import (
    Deployment,
    Finding,
    assert_each_revision_once,
    audited,
    fixture_lines,
    keyed,
    latest,
    wait_for,
)

VICTIM = "engine-fault-victim"
LATER = "after-the-restart"


def zombie(workflow: str, stale_id: str) -> list[tuple[bytes, bytes]]:
    """A takeover, then a stale progress (`stale_id`) and a stale commit of the displaced
    owner: a critical finding."""

    def event(event_id: str, seq: int, kind: str, epoch: int, **more: str) -> bytes:
        fields = {"event_id": event_id, "seq": seq, "kind": kind, "workflow_key": workflow}
        worker = f"worker-{epoch}"
        return json.dumps({**fields, "owner_epoch": epoch, "worker_id": worker, **more}).encode()

    return keyed(
        [
            event("a1", 1, "lease_acquired", 1, source="coordinator"),
            event("a2", 2, "lease_acquired", 2, source="coordinator"),
            event(stale_id, 3, "progress", 1),
            event("c4", 4, "effect_committed", 1, source="destination", effect_key="report/1"),
        ]
    )


def faulty_worker(deployment: Deployment) -> WorkerProcess:
    """`splitbrain worker`, whose engine raises on `FAULT_EVENT_ID`."""
    return deployment.worker(module="detector.testing.faulty_worker")


def engine_errors(w: WorkerProcess) -> float | None:
    return w.samples("splitbrain_engine_errors_total", "").get("")


def test_an_engine_error_costs_one_event_not_the_partition(deployment: Deployment) -> None:
    lines = keyed(fixture_lines())
    victim = zombie(VICTIM, FAULT_EVENT_ID)
    admin = AdminClient(deployment.config)
    w = faulty_worker(deployment)
    # One partition: the other workflows are processed before and after the fault, by the
    # same engine.
    deployment.publish([*lines[:8], *victim, *lines[8:]], partition=0)
    expected = audited(fixture_lines())

    def findings() -> list[Record]:
        return read_committed(deployment.config, deployment.topics.findings)

    def by_workflow() -> tuple[dict[str, Finding], list[Finding]]:
        seen = latest(findings())
        others = {fid: f for fid, f in seen.items() if f["workflow_key"] != VICTIM}
        return others, [f for f in seen.values() if f["workflow_key"] == VICTIM]

    wait_for(lambda: quiescent(admin, deployment.topics), "the group to commit it all", workers=[w])
    others, (marked,) = by_workflow()
    assert others == expected
    # What the victim's engine knew after the fault may be incomplete, and its finding says so.
    assert marked["evidence_truncated"] is True and marked["severity"] == "critical"
    assert "stale_effect_committed" in {c["kind"] for c in marked["conditions"]}
    wait_for(lambda: engine_errors(w) == 1.0, "the engine error to be counted", workers=[w])

    (dead,) = read_committed(deployment.config, deployment.topics.dlq)
    assert (dead.partition, dead.key, dead.value) == (0, *victim[2])
    reason = dead.headers["error.reason"]
    assert reason.startswith(b"engine_error: InjectedFaultError (traceback "), reason
    assert dead.headers["error.class"] == b"InjectedFaultError"
    assert dead.headers["error.traceback_hash"].decode() in reason.decode()
    assert dead.headers["detector.version"]
    assert dead.headers["source.topic"] == deployment.topics.input.encode()
    assert dead.headers["source.offset"] == b"10"  # the 11th record of partition 0

    # A restart does not meet the event again, and goes on with new ones.
    assert w.stop() == 0, w.tail()
    w.start()
    deployment.publish(zombie(LATER, "p3"), partition=0)

    def later_found() -> bool:
        return any(f["workflow_key"] == LATER for f in latest(findings()).values())

    wait_for(later_found, "a finding of a workflow published after the restart", workers=[w])
    wait_for(lambda: quiescent(admin, deployment.topics), "the group to commit it all", workers=[w])
    assert engine_errors(w) == 0.0, w.tail()
    assert w.log.read_text().count("engine error on") == 1
    assert len(read_committed(deployment.config, deployment.topics.dlq)) == 1
    records = findings()
    assert_each_revision_once(records)
    assert {fid: f for fid, f in latest(records).items() if f["workflow_key"] != LATER} == {
        **expected,
        marked["finding_id"]: marked,
    }
    assert w.stop() == 0, w.tail()
