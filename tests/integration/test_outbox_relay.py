"""The outbox relay against a real PostgreSQL and a real broker: every transition reaches the
topic keyed by its job and in its seq order, relayed rows are marked and pruned, and neither a
broker restart nor a database restart loses a row or publishes one under a second event id."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from detector.contracts.events import parse_event_obj
from detector.devstack.kafka import LocalKafka
from detector.devstack.kafka_cluster import AnyKafka
from detector.devstack.postgres import LocalPostgres
from detector.devstack.topics import Record, TopicReader, WorkerTopics, read_committed
from detector.devstack.worker import connection_env
from detector.leases import LeaseLost, LeaseStore, StoreUnavailableError
from detector.leases.db import connect
from detector.leases.gauges import LeaseGauges
from detector.leases.relay import OutboxRelay, relay_until_empty
from tests.integration.leases import job_class

OCR = job_class("ocr", lease_s=5.0, heartbeat_s=1.0, reserve_s=1.0)


@pytest.fixture
def topics(kafka_broker: LocalKafka) -> WorkerTopics:
    return WorkerTopics.fresh("relay").create(kafka_broker.client_config(), 3)


@pytest.fixture
def topic(topics: WorkerTopics) -> str:
    return topics.input


def one_job(store: LeaseStore, n: int) -> None:
    """A job's whole life: enqueued, claimed, extended twice, completed (four events).

    When an outage broke a claim's commit, that claim may have committed: then this claim finds
    nothing to take (the earlier job's lease still holds), and the job's life ends there."""
    store.enqueue("ocr", f"doc:{n}:ocr", {"doc": n})
    lease = store.claim("ocr", "w1")
    if lease is None:
        return
    for _ in range(2):
        assert not isinstance(store.extend(lease), LeaseLost)
    store.complete(lease, {"n": n})


def outbox_rows(dsn: str) -> list[dict[str, Any]]:
    """On a connection of its own: a test's connection would not survive a server restart."""
    with connect(dsn) as conn:
        return conn.execute("SELECT job_id, seq, event, relayed_at FROM tool_job_outbox").fetchall()


def by_job(records: list[Record]) -> dict[str, list[dict[str, Any]]]:
    """The events read, per key, in the order their partition holds them."""
    out: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key is not None
        event = json.loads(record.value)
        parse_event_obj(event)  # the input contract, as the detector reads it
        assert event["workflow_key"] == record.key.decode()
        out.setdefault(record.key.decode(), []).append(event)
    return out


def test_every_transition_is_published_keyed_by_its_job_in_seq_order_and_marked(
    postgres_dsn: str, db: psycopg.Connection[DictRow], kafka_broker: LocalKafka, topic: str
) -> None:
    with LeaseStore(postgres_dsn, [OCR]) as store:
        for n in range(25):
            one_job(store, n)
    relay = OutboxRelay(postgres_dsn, kafka_broker.client_config(), topic=topic, batch=40)
    try:
        assert relay_until_empty(relay) == 25 * 4
        assert relay.step().published == 0
    finally:
        relay.close()
    events = by_job(read_committed(kafka_broker.client_config(), topic))
    assert len(events) == 25
    for job, seen in events.items():
        assert [e["seq"] for e in seen] == [1, 2, 3, 4], job
        assert [e["kind"] for e in seen] == [
            "lease_acquired",
            "heartbeat",
            "heartbeat",
            "lease_released",
        ]
        assert [e["event_id"] for e in seen] == [f"{job}:{s}" for s in range(1, 5)]
    assert all(row["relayed_at"] is not None for row in outbox_rows(postgres_dsn))


def test_relayed_rows_are_pruned_after_the_retention(
    postgres_dsn: str, db: psycopg.Connection[DictRow], kafka_broker: LocalKafka, topic: str
) -> None:
    with LeaseStore(postgres_dsn, [OCR]) as store:
        one_job(store, 1)
    relay = OutboxRelay(
        postgres_dsn, kafka_broker.client_config(), topic=topic, retention=timedelta(0)
    )
    try:
        assert relay.step().published == 4
        assert relay.step().pruned.outbox_rows == 4
    finally:
        relay.close()
    assert outbox_rows(postgres_dsn) == []


def long_job(store: LeaseStore, n: int, extensions: int) -> None:
    """A job with many transitions: claimed, extended `extensions` times, completed."""
    store.enqueue("ocr", f"doc:{n}:long", {"doc": n})
    lease = store.claim("ocr", "w1")
    assert lease is not None
    for _ in range(extensions):
        assert not isinstance(store.extend(lease), LeaseLost)
    store.complete(lease, {"n": n})


def test_two_relays_publish_each_job_s_events_in_seq_order(
    postgres_dsn: str, db: psycopg.Connection[DictRow], kafka_broker: LocalKafka, topic: str
) -> None:
    """Issue 23: several relays, small batches, a backlog: a job's events are split over many
    batches and both relays take part, and each job's events reach the topic in seq order."""
    jobs, extensions = 8, 30
    relays = [
        OutboxRelay(postgres_dsn, kafka_broker.client_config(), topic=topic, batch=5)
        for _ in range(2)
    ]
    for r in relays:  # both connected before the backlog exists: neither drains it alone
        r.step(prune=False)  # while the other is still connecting
    with LeaseStore(postgres_dsn, [OCR]) as store:
        for n in range(jobs):
            long_job(store, n, extensions)
    per_job = extensions + 2
    stop = threading.Event()
    threads = [
        threading.Thread(target=r.run, args=(stop,), kwargs={"idle_s": 0.05}) for r in relays
    ]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while any(row["relayed_at"] is None for row in outbox_rows(postgres_dsn)):
            assert time.monotonic() < deadline, "the outbox was not drained"
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for r in relays:
            r.close()
    assert all(r.published > 0 for r in relays), [r.published for r in relays]
    assert sum(r.published for r in relays) == jobs * per_job  # each row once
    events = by_job(read_committed(kafka_broker.client_config(), topic))
    assert len(events) == jobs
    for job, seen in events.items():
        assert [e["seq"] for e in seen] == list(range(1, per_job + 1)), job


class Traffic(threading.Thread):
    """Whole job lives one after another until stopped, through outages of either server."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.stop = threading.Event()
        self.jobs = 0
        self.tries = 0
        self.crashed: list[BaseException] = []

    def run(self) -> None:
        try:
            with LeaseStore(self.dsn, [OCR]) as store:
                while not self.stop.is_set():
                    self.tries += 1
                    try:
                        one_job(store, self.tries)
                        self.jobs += 1
                    except StoreUnavailableError:
                        time.sleep(0.05)
        except BaseException as exc:
            self.crashed.append(exc)


def relay_through(
    postgres_dsn: str,
    kafka_broker: AnyKafka,
    topic: str,
    outage: Any,
) -> None:
    """Traffic and a running relay, an `outage()` in the middle; then every outbox row is on
    the topic exactly under its own event id."""
    reader = TopicReader(kafka_broker.client_config(), topic)  # first: it may fail, alone
    relay = OutboxRelay(postgres_dsn, kafka_broker.client_config(), topic=topic, ack_timeout_s=5)
    stop = threading.Event()
    relaying = threading.Thread(target=relay.run, args=(stop,), kwargs={"retry_s": 0.2})
    traffic = Traffic(postgres_dsn)
    relaying.start()
    traffic.start()
    try:
        deadline = time.monotonic() + 60
        while traffic.jobs < 20:
            assert time.monotonic() < deadline and not traffic.crashed, traffic.crashed
            time.sleep(0.05)
        outage()
        done_before = traffic.jobs
        while traffic.jobs < done_before + 20:
            assert time.monotonic() < deadline + 60 and not traffic.crashed, traffic.crashed
            time.sleep(0.05)
        traffic.stop.set()
        traffic.join()
        assert not traffic.crashed, traffic.crashed

        def unrelayed() -> int:
            try:
                return sum(1 for row in outbox_rows(postgres_dsn) if row["relayed_at"] is None)
            except StoreUnavailableError:
                return -1  # the server is still restarting

        while unrelayed() != 0:
            assert time.monotonic() < deadline + 120, f"{unrelayed()} rows never relayed"
            time.sleep(0.1)
    finally:
        stop.set()
        relaying.join()
        relay.close()
    rows = {(str(r["job_id"]), r["seq"]): r["event"]["event_id"] for r in outbox_rows(postgres_dsn)}
    published: dict[tuple[str, int], set[str]] = {}
    for job, events in by_job(reader.read_to_end()).items():
        for event in events:
            published.setdefault((job, event["seq"]), set()).add(event["event_id"])
    reader.close()
    assert set(published) == set(rows)
    assert all(ids == {rows[where]} for where, ids in published.items())


def test_the_relay_resumes_after_a_broker_restart_and_publishes_nothing_under_a_second_id(
    postgres_dsn: str, db: psycopg.Connection[DictRow], kafka_broker: LocalKafka, topic: str
) -> None:
    relay_through(postgres_dsn, kafka_broker, topic, kafka_broker.kill_and_restart)


def test_the_relay_resumes_after_a_database_restart_and_loses_no_row(
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    kafka_broker: LocalKafka,
    topic: str,
    postgres: LocalPostgres,
) -> None:
    def crash_database() -> None:
        postgres.restart(crash=True)

    relay_through(postgres_dsn, kafka_broker, topic, crash_database)


def relay_command(
    postgres_dsn: str, kafka_broker: LocalKafka, topic: str, *flags: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "detector.cli", "leases", "relay", "--topic", topic, *flags],
        env=connection_env(kafka_broker.client_config(), SPLITBRAIN_LEASES_DSN=postgres_dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_relay_command_runs_until_sigterm_and_exits_0(
    postgres_dsn: str, db: psycopg.Connection[DictRow], kafka_broker: LocalKafka, topic: str
) -> None:
    with LeaseStore(postgres_dsn, [OCR]) as store:
        for n in range(5):
            one_job(store, n)
    proc = relay_command(postgres_dsn, kafka_broker, topic)
    deadline = time.monotonic() + 60
    while any(row["relayed_at"] is None for row in outbox_rows(postgres_dsn)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the relay command relayed nothing"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"relayed 20 event(s) to {topic}" in err
    assert len(read_committed(kafka_broker.client_config(), topic)) == 20


def job_with_a_row_that_is_no_event(postgres_dsn: str, db: psycopg.Connection[DictRow]) -> str:
    """A job whose first outbox row is no valid event (no event id, owner or token: as a hand
    or an earlier version could have written it), then claimed and completed (two valid rows)."""
    with LeaseStore(postgres_dsn, [OCR]) as store:
        job = store.enqueue("ocr", "doc:1:ocr", {"doc": 1})
        db.execute(
            "INSERT INTO tool_job_outbox (job_id, seq, event) VALUES (%s, 1, %s)",
            (job.id, json.dumps(BAD_ROW | {"job": str(job.id)})),
        )
        db.execute("UPDATE tool_jobs SET event_seq = 1 WHERE id = %s", (job.id,))
        lease = store.claim("ocr", "w1")
        assert lease is not None
        store.complete(lease, {"n": 1})
    return str(job.id)


BAD_ROW = {"kind": "job_claimed", "owner_id": "w0"}


def test_an_outbox_row_that_is_no_event_goes_to_the_dlq_with_its_reason_and_the_relay_goes_on(
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    kafka_broker: LocalKafka,
    topics: WorkerTopics,
) -> None:
    job = job_with_a_row_that_is_no_event(postgres_dsn, db)
    with LeaseStore(postgres_dsn, [OCR]) as store:
        other = str(store.enqueue("ocr", "doc:2:ocr", {"doc": 2}).id)
    db.execute(
        "INSERT INTO tool_job_outbox (job_id, seq, event) VALUES (%s, 1, %s)",
        (other, json.dumps("not an event")),
    )
    gauges = LeaseGauges()
    config = kafka_broker.client_config()
    relay = OutboxRelay(
        postgres_dsn, config, topic=topics.input, dlq_topic=topics.dlq, gauges=gauges
    )
    try:
        assert relay_until_empty(relay) == 2
    finally:
        relay.close()
    dead, not_an_object = sorted(
        read_committed(config, topics.dlq), key=lambda r: r.key != job.encode()
    )
    assert not_an_object.key == other.encode()
    assert json.loads(not_an_object.value) == "not an event"
    assert not_an_object.headers["error.reason"] == b"invalid: not a JSON object"
    assert dead.key == job.encode()
    assert json.loads(dead.value) == BAD_ROW | {"job": job}
    assert dead.headers == {
        "error.reason": b"invalid: Field required",
        "error.field": b"event_id",
        "source.table": b"tool_job_outbox",
        "source.job": job.encode(),
        "source.seq": b"1",
    }
    events = by_job(read_committed(config, topics.input))
    assert [(e["kind"], e["seq"]) for e in events[job]] == [
        ("lease_acquired", 2),
        ("lease_released", 3),
    ]
    assert all(row["relayed_at"] is not None for row in outbox_rows(postgres_dsn))
    assert gauges.registry.get_sample_value("splitbrain_lease_store_dead_lettered_total") == 2
    assert gauges.registry.get_sample_value("splitbrain_lease_store_relayed_total") == 2


def test_the_relay_command_sends_a_row_that_is_no_event_to_its_dlq_topic_and_goes_on(
    postgres_dsn: str,
    db: psycopg.Connection[DictRow],
    kafka_broker: LocalKafka,
    topics: WorkerTopics,
) -> None:
    job = job_with_a_row_that_is_no_event(postgres_dsn, db)
    proc = relay_command(postgres_dsn, kafka_broker, topics.input, "--dlq-topic", topics.dlq)
    deadline = time.monotonic() + 60
    while any(row["relayed_at"] is None for row in outbox_rows(postgres_dsn)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the relay command relayed nothing"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"outbox row job={job} seq=1 is no valid event (event_id: Field required)" in err
    assert f"relayed 2 event(s) to {topics.input}" in err
    assert f"sent 1 invalid row(s) to {topics.dlq}" in err
    assert len(read_committed(kafka_broker.client_config(), topics.dlq)) == 1
