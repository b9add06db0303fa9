"""The partition test of the job-queue practice, against real servers: PostgreSQL, a Kafka
broker, a detector worker, the outbox relay and the fenced HTTP destination, all started here.

W1 claims and sends its external request; its database access is cut (a loopback proxy); its
lease expires and W2 claims and commits; W1's answer arrives; W1's access comes back. W1 cannot
extend and cannot write its result. With the fenced destination its effect is refused and the
detector's finding is a warning (the fence held); with the unfenced one the effect happens twice
and the finding is critical. The lease metrics show the expired lease, the extension failure and
the reclaim for W1's tool class.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow

from detector.devstack.kafka import LocalKafka
from detector.devstack.lease_worker import send_effect
from detector.devstack.worker import WorkerProcess
from detector.kafka.emit import Emitter
from detector.leases import Labels, LeaseStore, Outcome
from detector.leases.http_destination import DestinationServer
from detector.leases.relay import OutboxRelay
from detector.leases.runner import Execution, Runner, Status, ToolCall
from detector.leases.store import Lease
from detector.testing.proxy import TcpProxy
from tests.integration.conftest import deploy
from tests.integration.deployment import Deployment, finding_with, wait_for
from tests.integration.leases import job_class, wait_lapsed

PAY = job_class(
    "payments",
    lease_s=2.0,
    heartbeat_s=0.4,
    reserve_s=0.5,
    tool_timeout_s=60,
    stage_time_limit_s=120,
)
LABELS = Labels(tool_class="payments", model="none", provider="acme-pay")
KEY = "payment:inv-42:capture"

Finding = dict[str, Any]


class Stage:
    """Every server of the scene, started in order and stopped in reverse."""

    def __init__(
        self, stack: ExitStack, dsn: str, broker: LocalKafka, workdir: Path, *, fenced: bool
    ) -> None:
        self.deployment: Deployment = deploy(broker, workdir, "kafka")
        stack.callback(self.deployment.close)
        self.detector: WorkerProcess = self.deployment.worker("d1")
        self.destination = stack.enter_context(DestinationServer(dsn, "acme-pay", fenced=fenced))
        relay = OutboxRelay(dsn, self.deployment.config, topic=self.deployment.topics.input)
        stack.callback(relay.close)
        stop_relay = threading.Event()
        relaying = threading.Thread(target=relay.run, args=(stop_relay,), daemon=True)
        relaying.start()
        stack.callback(relaying.join)
        stack.callback(stop_relay.set)
        server = conninfo_to_dict(dsn)
        self.proxy = TcpProxy(str(server.get("host", "127.0.0.1")), int(str(server["port"])))
        stack.callback(self.proxy.close)
        emitter = Emitter(self.deployment.config, topic=self.deployment.topics.input)
        stack.callback(emitter.close)
        # W1 reaches the database only through the proxy; W2 directly.
        cut_off = make_conninfo(dsn, port=str(self.proxy.port), connect_timeout="2")
        self.w1 = Runner(cut_off, [PAY], "w1", emitter=emitter, destination="acme-pay")
        stack.callback(self.w1.close)
        self.w2 = Runner(dsn, [PAY], "w2", destination="acme-pay")
        stack.callback(self.w2.close)

    async def send(self, call: ToolCall) -> Any:
        return await asyncio.to_thread(send_effect, self.destination.url, call, 30.0)


def partition(
    stage: Stage, db: psycopg.Connection[DictRow], job_id: UUID
) -> tuple[Execution, Execution]:
    """The scene; W1's execution and W2's."""
    sent, answered, release = threading.Event(), threading.Event(), threading.Event()

    async def w1_tool(call: ToolCall) -> Any:
        sent.set()  # the request is out; the payment system answers when the test says so
        await asyncio.to_thread(release.wait, 60)
        try:
            return await stage.send(call)
        finally:
            answered.set()

    w1_done: list[Execution | None] = []
    w1 = threading.Thread(
        target=lambda: w1_done.append(asyncio.run(stage.w1.run_one("payments", w1_tool)))
    )
    w1.start()
    assert sent.wait(30)
    stage.proxy.cut()  # W1's database access is gone
    wait_lapsed(db, job_id)
    w2_done = asyncio.run(stage.w2.run_one("payments", stage.send))
    release.set()  # W1's answer arrives while it is still cut off
    assert answered.wait(30)
    stage.proxy.restore()
    w1.join(90)
    assert w1_done and w1_done[0] is not None and w2_done is not None
    return w1_done[0], w2_done


def finding_of(stage: Stage, want: set[str]) -> Finding:
    """The detector's latest revision once it lists every condition in `want`."""
    return finding_with(stage.deployment, want, [stage.detector])


def lease_metrics(stage: Stage) -> dict[str, float]:
    """The detector's lease metrics for W1's tool class, by metric name."""
    wanted = {
        "splitbrain_leases_expired_total",
        "splitbrain_lease_extension_failures_total",
        "splitbrain_jobs_reclaimed_total",
    }
    out: dict[str, float] = {}
    for (name, labels), value in stage.detector.metrics().items():
        if name in wanted and ("tool_class", "payments") in labels:
            out[name] = out.get(name, 0.0) + value
    return out


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_partition_a_displaced_worker_cannot_extend_or_commit_and_the_detector_grades_it(
    fenced: bool,
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    kafka_broker: LocalKafka,
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        stage = Stage(stack, postgres_dsn, kafka_broker, tmp_path, fenced=fenced)
        with LeaseStore(postgres_dsn, [PAY]) as store:
            job = store.enqueue("payments", KEY, {"entity": "inv-42"}, LABELS)
        w1, w2 = partition(stage, db, job.id)

        assert (w2.status, w2.fencing_token) == (Status.SUCCEEDED, 2)
        # W1 came back with its answer: its extension changed zero rows, it committed nothing.
        assert (w1.status, w1.fencing_token) == (Status.LEASE_LOST, 1)
        history = [r["event"] for r in db.execute("SELECT event FROM tool_job_outbox ORDER BY seq")]
        assert "heartbeat_lost" in [e["kind"] for e in history if e["fencing_token"] == 1]
        # Its result, written anyway, is refused; nothing shows it as success.
        with LeaseStore(postgres_dsn, [PAY]) as store:
            held = store.job(job.id)
            assert held is not None and held.lease_until is not None
            w1_lease = Lease(job.id, "payments", "w1", 1, 1, held.lease_until, KEY, {}, LABELS)
            assert store.complete(w1_lease, {"captured": True}) is Outcome.REJECTED
            final = store.job(job.id)
        assert final is not None
        assert (final.state, final.owner_id, final.fencing_token) == ("succeeded", "w2", 2)

        effects = db.execute(
            "SELECT fence FROM fenced_effects WHERE idempotency_key = %s ORDER BY id", (KEY,)
        ).fetchall()
        if fenced:
            assert [e["fence"] for e in effects] == [2]  # no second irreversible effect
            finding = finding_of(stage, {"stale_effect_rejected"})
            assert finding["severity"] == "warning"
            assert finding["sink_outcome"] == "rejected"
        else:
            assert [e["fence"] for e in effects] == [2, 1]
            finding = finding_of(stage, {"stale_effect_committed", "duplicate_effect"})
            assert finding["severity"] == "critical"
            duplicate = [c for c in finding["conditions"] if c["kind"] == "duplicate_effect"]
            assert duplicate[0]["cause"] == "failover"
        assert finding["workflow_key"] == str(job.id)
        assert (finding["displaced"]["owner_epoch"], finding["current"]["owner_epoch"]) == (1, 2)
        assert finding["ordering"] == "authoritative_seq"

        wait_for(
            lambda: (
                all(v >= 1 for v in lease_metrics(stage).values())
                and len(lease_metrics(stage)) == 3
            ),
            "the lease metrics of W1's tool class",
            60,
            [stage.detector],
        )
