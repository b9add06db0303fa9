"""The faust-streaming runtime against a real broker: the published history in, exactly the
findings `audit` computes out (read_committed), one dead letter for one poison record, a clean
exit on SIGTERM — and no duplicate or lost revision when the worker is killed with SIGKILL in the
middle of its transactions and restarted.

Each test owns fresh topics and a fresh consumer group, runs the worker as a subprocess
(`splitbrain worker --runtime faust`) and stops every process it started by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.cimpl import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from detector.cli.audit import audit_lines
from detector.contracts.events import parse_event_json
from detector.kafka.config import env_name
from detector.testing.kafka import LocalKafka, free_port
from tests.paths import SEED_FIXTURE
from tests.torture.harness import Topics

pytest.importorskip("faust", reason="the faust extra is not installed: pip install -e '.[faust]'")

REPO = Path(__file__).resolve().parents[2]
FIXTURE = SEED_FIXTURE
PARTITIONS = 3
DEADLINE_S = 120.0
POISON = b'{"event_id": "poison-1", "kind": "lease_acq'  # truncated JSON


def make_topics(broker: LocalKafka) -> Topics:
    tag = uuid.uuid4().hex[:10]
    names = Topics(f"own-{tag}", f"findings-{tag}", f"dlq-{tag}", f"detector-{tag}")
    admin = AdminClient(broker.client_config())
    new = [NewTopic(t, PARTITIONS, 1) for t in (names.input, names.findings, names.dlq)]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    return names


@pytest.fixture
def topics(kafka_broker: LocalKafka) -> Topics:
    return make_topics(kafka_broker)


@dataclass
class Worker:
    """One `splitbrain worker --runtime faust` process, stopped by its PID."""

    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int | None = None

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample the worker's /metrics serves, by (name, labels)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def terminate(self, timeout: float = 60.0) -> int:
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@contextlib.contextmanager
def worker(
    broker: LocalKafka, t: Topics, state: Path, name: str, metrics_port: int | None = None
) -> Iterator[Worker]:
    """Run a worker named `name` (its instance id, state directory and log file)."""
    log = state / f"{name}.log"
    state.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "detector.cli",
        "worker",
        "--runtime",
        "faust",
        "--input-topic",
        t.input,
        "--findings-topic",
        t.findings,
        "--dlq-topic",
        t.dlq,
        "--group-id",
        t.group,
        "--instance-id",
        name,
        "--state-dir",
        str(state / name),
        *(["--metrics-port", str(metrics_port)] if metrics_port else []),
    ]
    # The connection (and the SASL password) comes from the environment, as in production.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPLITBRAIN_")}
    env.update({env_name(k): str(v) for k, v in broker.client_config().items()})
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
        )
    w = Worker(proc, log, metrics_port)
    try:
        yield w
    finally:
        if proc.poll() is None:
            w.kill()


def publish(broker: LocalKafka, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({**broker.client_config(), "enable.idempotence": True, "linger.ms": 5})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        producer.poll(0)
    assert producer.flush(30) == 0


def fixture_records(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    return [(json.loads(line)["workflow_key"].encode(), line) for line in lines]


def expected_findings(lines: list[bytes]) -> dict[str, dict[str, Any]]:
    result = audit_lines(iter(lines))
    return {fid: json.loads(f.to_json()) for fid, f in result.findings.items()}


@dataclass
class Reader:
    """A read_committed reader of every partition of a topic, from the beginning."""

    broker: LocalKafka
    topic: str
    records: list[tuple[int, bytes | None, bytes | None, dict[str, bytes]]] = field(
        default_factory=list
    )
    at_end: set[int] = field(default_factory=set)
    consumer: Consumer | None = None

    def __enter__(self) -> Reader:
        self.consumer = Consumer(
            {
                **self.broker.client_config(),
                "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        self.consumer.assign(
            [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.consumer is not None
        self.consumer.close()

    def poll(self, seconds: float = 0.5) -> None:
        """Read what is committed now, for about `seconds`."""
        assert self.consumer is not None
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err.str()
                self.at_end.add(msg.partition() or 0)
                continue
            self.at_end.discard(msg.partition() or 0)
            raw = msg.headers() or []
            pairs = raw.items() if isinstance(raw, dict) else raw
            headers = {k: v for k, v in pairs if isinstance(v, bytes)}
            self.records.append((msg.partition() or 0, msg.key(), msg.value(), headers))

    def caught_up(self) -> bool:
        return len(self.at_end) == PARTITIONS

    def latest_findings(self) -> dict[str, dict[str, Any]]:
        latest: dict[str, dict[str, Any]] = {}
        for _, _, value, _ in self.records:
            assert value is not None
            doc = json.loads(value)
            old = latest.get(doc["finding_id"])
            if old is None or doc["revision"] > old["revision"]:
                latest[doc["finding_id"]] = doc
        return latest

    def revisions(self) -> list[tuple[str, int]]:
        out = []
        for _, _, value, _ in self.records:
            assert value is not None
            doc = json.loads(value)
            out.append((doc["finding_id"], doc["revision"]))
        return out


def wait_for_findings(
    reader: Reader, expected: dict[str, dict[str, Any]], workers: list[Worker]
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (latest := reader.latest_findings()) != expected:
        for w in workers:
            assert w.proc.poll() is None, f"worker exited {w.proc.returncode}:\n{w.tail()}"
        if time.monotonic() > deadline:
            same = sum(1 for fid, doc in expected.items() if latest.get(fid) == doc)
            extra = sorted(set(latest) - set(expected))[:3]
            raise AssertionError(
                f"after {DEADLINE_S:.0f}s: {same} of {len(expected)} findings as expected, "
                f"{len(latest)} seen, unexpected: {extra}\n{workers[-1].tail()}"
            )
        reader.poll()


def assert_no_duplicates(reader: Reader) -> None:
    seen = reader.revisions()
    dupes = {r for r in seen if seen.count(r) > 1}
    assert not dupes, f"(finding_id, revision) published twice: {sorted(dupes)[:5]}"
    by_id: dict[str, list[int]] = {}
    for fid, rev in seen:
        by_id.setdefault(fid, []).append(rev)
    for fid, revs in by_id.items():
        assert revs == list(range(1, len(revs) + 1)), f"{fid}: revisions {revs} skip or reorder"


def test_fixture_findings_and_poison_exactly_once(
    kafka_broker: LocalKafka, topics: Topics, tmp_path: Path
) -> None:
    lines = [line.rstrip(b"\n") for line in FIXTURE.read_bytes().splitlines() if line.strip()]
    expected = expected_findings(lines)
    assert expected, "the fixture must produce at least one finding"
    with worker(kafka_broker, topics, tmp_path, "w1", metrics_port=free_port()) as w:
        publish(kafka_broker, topics.input, [*fixture_records(lines), (b"export-ledger", POISON)])
        with Reader(kafka_broker, topics.findings) as findings:
            wait_for_findings(findings, expected, [w])
            with Reader(kafka_broker, topics.dlq) as dlq:
                while not (dlq.records and dlq.caught_up()):
                    assert w.proc.poll() is None, w.tail()
                    dlq.poll()
            settle(kafka_broker, topics, findings)
            assert findings.latest_findings() == expected
            assert_no_duplicates(findings)
            assert_metrics_count(w, lines, len(findings.records))
        assert w.terminate() == 0, w.tail()

    assert len(dlq.records) == 1, dlq.records
    _, key, value, header = dlq.records[0]
    assert (key, value) == (b"export-ledger", POISON)
    assert header["error.reason"].startswith(b"invalid"), header
    assert header["source.topic"] == topics.input.encode()
    # Each finding went to the partition of the events it is about (co-partitioned).
    with Reader(kafka_broker, topics.input) as events:
        while not events.caught_up():
            events.poll()
    source = {key: partition for partition, key, _, _ in events.records}
    for partition, key, _, _ in findings.records:
        assert source[key] == partition, (key, partition)


def assert_metrics_count(w: Worker, lines: list[bytes], revisions: int) -> None:
    """The faust runtime's /metrics count what it did, with bounded labels only."""
    kinds = Counter(parse_event_json(line).kind.value for line in lines)
    deadline = time.monotonic() + DEADLINE_S
    # A commit is counted just after the broker took it: wait for the last one to be counted.
    while not w.metrics().get(("splitbrain_transactions_total", (("outcome", "committed"),))):
        assert time.monotonic() < deadline, "no committed transaction was ever counted"
        time.sleep(0.2)
    samples = w.metrics()
    events = {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "splitbrain_events_total"
    }
    assert events == kinds
    dead = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "splitbrain_dlq_messages_total"
    }
    assert {reason: n for reason, n in dead.items() if n} == {"invalid": 1.0}, dead
    published = sum(
        value
        for (name, _), value in samples.items()
        if name == "splitbrain_finding_revisions_total"
    )
    assert published == revisions
    assert not samples.get(("splitbrain_transactions_total", (("outcome", "aborted"),)))
    workflows = sum(
        value for (name, _), value in samples.items() if name == "splitbrain_state_workflows"
    )
    assert workflows == len({parse_event_json(line).workflow_key for line in lines})
    label_values = {v for _, labels in samples for _, v in labels}
    assert not {key for key in label_values if "export-ledger" in key}, label_values
    assert samples[("splitbrain_state_restore_seconds_count", ())] >= 1
    # Every 5 s the event loop reports that it runs, and the lag of each partition it processed.
    last_poll = samples[("splitbrain_worker_last_poll_timestamp_seconds", ())]
    assert abs(time.time() - last_poll) < 15

    def lags() -> list[float]:
        return [
            v for (name, _), v in w.metrics().items() if name == "splitbrain_consumer_lag_records"
        ]

    while not (lags() and not any(lags())):
        assert time.monotonic() < deadline, f"the lag never reached 0: {lags()}"
        time.sleep(0.2)

    def open_critical() -> float:
        return sum(
            v
            for (name, labels), v in w.metrics().items()
            if name == "splitbrain_findings_open" and ("severity", "critical") in labels
        )

    while open_critical() != 1:  # the fixture leaves one critical finding open
        assert time.monotonic() < deadline, f"open critical findings: {open_critical()}"
        time.sleep(0.2)


def assert_exactly_once(
    broker: LocalKafka,
    t: Topics,
    findings: Reader,
    expected: dict[str, dict[str, Any]],
    workers: list[Worker],
) -> None:
    """Once the input is done: the latest revisions equal audit's, and each revision was
    published once."""
    wait_for_findings(findings, expected, workers)
    settle(broker, t, findings)
    assert findings.latest_findings() == expected
    assert_no_duplicates(findings)


def many_workflows(copies: int) -> list[bytes]:
    """The fixture's three workflows, `copies` times over under distinct keys and event ids."""
    base = [json.loads(line) for line in FIXTURE.read_bytes().splitlines() if line.strip()]
    return [
        json.dumps(
            {
                **ev,
                "workflow_key": f"{ev['workflow_key']}#{copy}",
                "event_id": f"{ev['event_id']}-{copy}",
            }
        ).encode()
        for copy in range(copies)
        for ev in base
    ]


def settle(broker: LocalKafka, t: Topics, findings: Reader) -> None:
    """Until the group has committed the whole input and no transaction on the findings topic is
    open, then read the findings to their end: after that, nothing more can appear."""
    admin = AdminClient(broker.client_config())
    parts = range(PARTITIONS)
    deadline = time.monotonic() + DEADLINE_S

    def ends(topic: str, isolation: IsolationLevel) -> list[int]:
        request = {TopicPartition(topic, p): OffsetSpec.latest() for p in parts}
        futures = admin.list_offsets(request, isolation_level=isolation)
        return [f.result(30).offset for f in futures.values()]

    while time.monotonic() < deadline:
        request = ConsumerGroupTopicPartitions(t.group, [TopicPartition(t.input, p) for p in parts])
        done = next(iter(admin.list_consumer_group_offsets([request]).values())).result(30)
        committed = sorted((tp.partition, tp.offset) for tp in done.topic_partitions)
        input_ends = ends(t.input, IsolationLevel.READ_UNCOMMITTED)
        stable = ends(t.findings, IsolationLevel.READ_COMMITTED)
        if [o for _, o in committed] == input_ends and stable == ends(
            t.findings, IsolationLevel.READ_UNCOMMITTED
        ):
            break
        findings.poll(0.2)
    else:
        raise AssertionError("the group never committed the whole input")
    wanted = [TopicPartition(t.findings, p) for p in parts]

    def behind() -> bool:
        positions = findings.consumer.position(wanted) if findings.consumer else []
        return any(end > 0 and tp.offset < end for tp, end in zip(positions, stable, strict=True))

    while behind():
        assert time.monotonic() < deadline, "the reader never reached the committed end"
        findings.poll(0.2)


def trickle(broker: LocalKafka, topic: str, records: list[tuple[bytes, bytes]]) -> threading.Thread:
    """Publish in small batches from a thread, so workers are mid-stream when a test acts."""

    def send() -> None:
        for i in range(0, len(records), 100):
            publish(broker, topic, records[i : i + 100])
            time.sleep(0.05)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def wait_for_count(reader: Reader, count: int, w: Worker) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(reader.records) < count:
        assert w.proc.poll() is None, w.tail()
        assert time.monotonic() < deadline, w.tail()
        reader.poll()


def test_sigkill_mid_stream_loses_and_duplicates_nothing(
    kafka_broker: LocalKafka, topics: Topics, tmp_path: Path
) -> None:
    """kill -9 while transactions are open, restart: read_committed readers see each revision
    once and the final revisions equal the offline audit (faust #517 does not bite here)."""
    lines = many_workflows(150)
    expected = expected_findings(lines)
    with worker(kafka_broker, topics, tmp_path, "first") as first:
        sender = trickle(kafka_broker, topics.input, fixture_records(lines))
        with Reader(kafka_broker, topics.findings) as findings:
            wait_for_count(findings, 60, first)
            first.kill()  # SIGKILL: open transactions stay open until the restart fences them
            seen_before_kill = len(findings.records)
            sender.join(timeout=60)
            assert not sender.is_alive()
            with worker(kafka_broker, topics, tmp_path, "second") as second:
                assert_exactly_once(kafka_broker, topics, findings, expected, [second])
                assert second.terminate() == 0, second.tail()
    assert seen_before_kill < len(findings.records), "the kill came after all the work"


def test_scale_out_moves_state_with_partitions(
    kafka_broker: LocalKafka, topics: Topics, tmp_path: Path
) -> None:
    """A second worker joins mid-stream: partitions and their table state move to it through
    the changelog, the first worker's producers for them are fenced (faust #323), and readers
    still see every revision exactly once."""
    lines = many_workflows(150)
    expected = expected_findings(lines)
    with worker(kafka_broker, topics, tmp_path, "a") as a:
        sender = trickle(kafka_broker, topics.input, fixture_records(lines))
        with Reader(kafka_broker, topics.findings) as findings:
            wait_for_count(findings, 60, a)
            with worker(kafka_broker, topics, tmp_path, "b") as b:
                sender.join(timeout=60)
                assert not sender.is_alive()
                assert_exactly_once(kafka_broker, topics, findings, expected, [a, b])
                assert b.terminate() == 0, b.tail()
            assert a.terminate() == 0, a.tail()
        assert "finding " in b.log.read_text(), "the second worker never got a partition"


def test_sigterm_mid_stream_commits_what_it_did_and_resumes(
    kafka_broker: LocalKafka, topics: Topics, tmp_path: Path
) -> None:
    """A deploy: SIGTERM while events are flowing exits 0 after committing the events it
    finished; the next worker resumes from there without repeating a revision."""
    lines = many_workflows(150)
    expected = expected_findings(lines)
    with worker(kafka_broker, topics, tmp_path, "old") as old:
        sender = trickle(kafka_broker, topics.input, fixture_records(lines))
        with Reader(kafka_broker, topics.findings) as findings:
            wait_for_count(findings, 60, old)
            assert old.terminate() == 0, old.tail()
            sender.join(timeout=60)
            assert not sender.is_alive()
            with worker(kafka_broker, topics, tmp_path, "new") as new:
                assert_exactly_once(kafka_broker, topics, findings, expected, [new])
                assert new.terminate() == 0, new.tail()
    assert "finding " in new.log.read_text(), "the old worker finished everything before SIGTERM"


def test_sasl_ssl_scram_connection(kafka_sasl_broker: LocalKafka, tmp_path: Path) -> None:
    """librdkafka's SASL_SSL + SCRAM-SHA-512 + CA settings reach aiokafka intact."""
    t = make_topics(kafka_sasl_broker)
    lines = [line.rstrip(b"\n") for line in FIXTURE.read_bytes().splitlines() if line.strip()]
    expected = expected_findings(lines)
    with worker(kafka_sasl_broker, t, tmp_path, "secure") as w:
        publish(kafka_sasl_broker, t.input, fixture_records(lines))
        with Reader(kafka_sasl_broker, t.findings) as findings:
            wait_for_findings(findings, expected, [w])
            assert_no_duplicates(findings)
        assert w.terminate() == 0, w.tail()
