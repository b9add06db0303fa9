"""`splitbrain leases cancel` through the real pipeline (issue 23): PostgreSQL, the outbox relay,
a Kafka broker and a detector worker. The cancel's events reach the input topic in the job's
order, and an effect the cancelled owner makes afterwards is stale to the detector: refused by a
fenced destination (a warning), or committed by an unfenced one (critical), with the operator's
token as the current owner's."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.contracts.events import Kind
from detector.leases import EffectRequest, FencedDestination, LeaseLost, LeaseStore
from detector.leases.relay import OutboxRelay
from tests.integration.deployment import Deployment, finding_with, wait_for
from tests.integration.leases import claimed, job_class

PAY = job_class("payments", lease_s=30.0, heartbeat_s=5.0, reserve_s=5.0)
KEY = "payment:inv-7:capture"


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_a_cancelled_owner_s_later_effect_is_stale_to_the_detector(
    fenced: bool,
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    kafka_deployment: Deployment,
) -> None:
    detector = kafka_deployment.worker("d1")
    with LeaseStore(postgres_dsn, [PAY]) as store:
        store.enqueue("payments", KEY, {"invoice": 7})
        w1 = claimed(store.claim("payments", "w1"))
        assert store.request_started(w1, request_id=KEY) == w1
        cancelled = store.cancel(w1.job_id, by="ops-oncall")
        assert cancelled is not None and cancelled.fencing_token == 2
        assert isinstance(store.extend(w1), LeaseLost)  # W1 learns it at its next heartbeat
    # ... but its request was already out: the payment provider answers, and the destination
    # gets W1's effect under its old fence, after the cancel.
    with FencedDestination(postgres_dsn, "acme-pay", fenced=fenced) as destination:
        receipt = destination.apply(
            EffectRequest(
                job_id=w1.job_id,
                worker_id="w1",
                fence=1,
                idempotency_key=KEY,
                entity="invoice-7",
            ),
            {"amount": 100},
        )
    assert receipt.status == ("rejected" if fenced else "accepted")

    relay = OutboxRelay(postgres_dsn, kafka_deployment.config, topic=kafka_deployment.topics.input)
    stop = threading.Event()
    relaying = threading.Thread(target=relay.run, args=(stop,))
    relaying.start()
    try:
        want = {"stale_effect_rejected"} if fenced else {"stale_effect_committed"}
        finding = finding_with(kafka_deployment, want, [detector])
        # The cancel's events are on the input topic, in the job's order.
        with kafka_deployment.reader(kafka_deployment.topics.input) as reader:

            def all_six() -> bool:
                reader.poll(0.5)
                return len(reader.records) >= 6

            wait_for(all_six, "the job's six events on the input topic")
            events = [json.loads(r.value) for r in reader.records]
    finally:
        stop.set()
        relaying.join()
        relay.close()
    assert [(Kind(e["kind"]), e["owner_epoch"], e["worker_id"]) for e in events] == [
        (Kind.LEASE_ACQUIRED, 1, "w1"),
        (Kind.EFFECT_ATTEMPTED, 1, "w1"),
        (Kind.LEASE_ACQUIRED, 2, "ops-oncall"),
        (Kind.LEASE_RELEASED, 2, "ops-oncall"),
        (Kind.LEASE_LOST, 1, "w1"),
        (Kind.EFFECT_REJECTED if fenced else Kind.EFFECT_COMMITTED, 1, "w1"),
    ]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert events[3]["detail"]["outcome"] == "cancelled"
    assert events[4]["detail"]["reason"] == "cancelled"
    assert finding["workflow_key"] == str(w1.job_id)
    assert (finding["displaced"]["owner_epoch"], finding["current"]["owner_epoch"]) == (1, 2)
    assert finding["current"]["worker_id"] == "ops-oncall"
    assert finding["severity"] == ("warning" if fenced else "critical")
    assert finding["ordering"] == "authoritative_seq"
