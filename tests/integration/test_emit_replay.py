"""The emitter and `splitbrain replay` against a real broker: every event lands, unchanged, on
the partition Java's partitioner picks for its workflow, in order per workflow."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

from detector.contracts.events import Kind, OwnershipEvent, Source, parse_event_json
from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import Record
from detector.histories.reader import GoodLine, read_history
from detector.kafka.emit import DeliveryError, Emitter
from tests.paths import SEED_FIXTURE

from .kafka_harness import (
    OwnerFields,
    broker_env,
    create_topic,
    delete_topics,
    java_partition,
    murmur2,
    read_topic,
    splitbrain,
    unique,
)

PARTITIONS = 6


@pytest.fixture
def topic(kafka_broker: LocalKafka) -> Iterator[str]:
    name = create_topic(kafka_broker, unique("test-ownership"), PARTITIONS)
    yield name
    delete_topics(kafka_broker, [name])


def generated_history(keys: int) -> list[str]:
    """Five events per workflow, the workflows interleaved, so order per key is a real test;
    some keys are not ASCII, and every tenth workflow is a job-queue logfmt log."""
    lines = []
    for step in range(5):
        for i in range(keys):
            key = f"tenant-{i % 7}/export/{i}" + ("/müller-ß" if i % 11 == 0 else "")
            if i % 10 == 0:
                lines.append(f"heartbeat_ok job=legacy-{i} token={step + 1} worker=w{i} seq={step}")
                continue
            event = {
                "event_id": f"gen-{i}-{step}",
                "kind": "progress" if step else "lease_acquired",
                "workflow_key": key,
                "owner_epoch": 1,
                "worker_id": f"worker-{i}",
                "seq": step,
                "detail": {"step": step},
            }
            lines.append(json.dumps(event, ensure_ascii=False))
    return lines


def by_key_in_log_order(records: list[Record]) -> dict[bytes, list[Record]]:
    grouped: dict[bytes, list[Record]] = defaultdict(list)
    for msg in sorted(records, key=lambda m: (m.partition, m.offset)):
        grouped[msg.key or b""].append(msg)
    return grouped


def test_test_partitioner_is_javas() -> None:
    """Vectors from Kafka's own UtilsTest, so the oracle below is the real one."""
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971


def test_replay_lands_every_event_on_its_java_partition_in_order(
    kafka_broker: LocalKafka, topic: str, tmp_path: Path
) -> None:
    lines = SEED_FIXTURE.read_text().splitlines() + generated_history(keys=300)
    history = tmp_path / "history.log"
    history.write_text("\n".join(lines) + "\n", encoding="utf-8")
    items = list(read_history(history.read_bytes().splitlines()))
    sent = [item.event for item in items if isinstance(item, GoodLine)]
    assert len(sent) == len(lines)

    result = splitbrain("replay", str(history), "--topic", topic, env=broker_env(kafka_broker))
    assert result.returncode == 0, result.stderr
    assert f"replayed {len(sent)} event(s) to {topic}, skipped 0 invalid line(s)" in result.stderr

    records = read_topic(kafka_broker, topic, len(sent))
    for msg in records:
        key = msg.key or b""
        assert msg.partition == java_partition(key, PARTITIONS), key
        event = parse_event_json(msg.value)
        assert key == event.workflow_key.encode("utf-8")
    expected: dict[bytes, list[OwnershipEvent]] = defaultdict(list)
    for event in sent:
        expected[event.workflow_key.encode("utf-8")].append(event)
    got = {
        key: [parse_event_json(m.value) for m in msgs]
        for key, msgs in by_key_in_log_order(records).items()
    }
    assert got == expected  # same events, unchanged, in file order per workflow, none twice
    legacy = [
        n for n, line in enumerate(lines, 1) if line.startswith("heartbeat_ok job=legacy-10 ")
    ]
    assert [e.event_id for e in got[b"legacy-10"]] == [f"line-{n}" for n in legacy]
    assert {m.partition for m in records} == set(range(PARTITIONS))


def test_replay_reports_bad_lines_with_their_number_and_sends_the_rest(
    kafka_broker: LocalKafka, topic: str
) -> None:
    good = [
        '{"event_id": "b1", "kind": "lease_acquired", "workflow_key": "wf-b", '
        '"owner_epoch": 3, "worker_id": "w1", "seq": 1}',
        '{"event_id": "b2", "kind": "progress", "workflow_key": "wf-b", '
        '"owner_epoch": 3, "worker_id": "w1", "seq": 2}',
        "job_claimed job=wf-c token=9 worker=w2 seq=4",
        '{"event_id": "b4", "kind": "effect_committed", "workflow_key": "wf-b", '
        '"owner_epoch": 3, "worker_id": "w1", "effect_key": "out/1", "source": "destination"}',
    ]
    stdin = "\n".join(
        [
            good[0],
            good[1],
            '{"event_id": "x3", "kind": "progress", "workflow_key": "wf-b", '
            '"owner_epoch": -1, "worker_id": "w1"}',
            "",
            "{not json",
            good[2],
            '{"event_id": "x7", "kind": "effect_committed", "workflow_key": "wf-b", '
            '"owner_epoch": 3, "worker_id": "w1"}',
            good[3],
        ]
    )
    result = splitbrain(
        "replay", "-", "--topic", topic, env=broker_env(kafka_broker), stdin=stdin + "\n"
    )
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 3
    assert skipped[0].startswith("skipped line 3: owner_epoch: ")
    assert skipped[1].startswith("skipped line 5: ")
    assert skipped[2].startswith("skipped line 7: ") and "effect_key" in skipped[2]
    assert "replayed 4 event(s)" in result.stderr

    records = read_topic(kafka_broker, topic, len(good))
    ids = {parse_event_json(m.value).event_id for m in records}
    assert ids == {"b1", "b2", "line-6", "b4"}


def test_emitter_helpers_carry_trace_context_and_span_attributes(
    kafka_broker: LocalKafka, topic: str
) -> None:
    tracer = TracerProvider().get_tracer("test")
    owner: OwnerFields = {"workflow_key": "wf-trace", "owner_epoch": 18, "worker_id": "worker-beta"}
    with Emitter(kafka_broker.client_config(), topic=topic) as emitter:
        with tracer.start_as_current_span("lease work") as span:
            sent = [
                emitter.lease_acquired(
                    **owner, seq=5, lease_duration_s=90, heartbeat_interval_s=30
                ),
                emitter.heartbeat(**owner),
                emitter.progress(**owner, detail={"rows": 600}),
                emitter.effect_attempted(**owner, effect_key="release/1", destination="index"),
                emitter.effect_committed(
                    **owner, effect_key="release/1", source=Source.DESTINATION
                ),
                emitter.effect_rejected(**owner, effect_key="release/2"),
                emitter.outcome_verified(**owner, effect_key="release/1"),
                emitter.ownership_uncertain(**owner),
                emitter.lease_lost(**owner),
                emitter.lease_released(**owner, event_id="last"),
            ]
        untraced = emitter.emit(kind="progress", **owner)
    context = span.get_span_context()
    ids = f"{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    traceparent = f"00-{ids}".encode()
    assert isinstance(span, ReadableSpan)  # the SDK's span, which keeps what was set on it
    assert dict(span.attributes or {}) == {
        "splitbrain.workflow.key": "wf-trace",
        "splitbrain.owner.epoch": 18,
    }

    records = read_topic(kafka_broker, topic, len(sent) + 1)
    assert {m.partition for m in records} == {java_partition(b"wf-trace", PARTITIONS)}
    got = [parse_event_json(m.value) for m in records]
    assert got == [*sent, untraced]
    assert {e.kind for e in got[:10]} == set(Kind)
    assert got[0].source is Source.COORDINATOR
    assert got[6].source is Source.VERIFIER
    assert got[9].event_id == "last"
    assert all(e.observed_at is not None for e in got)
    for msg in records[:-1]:
        assert msg.headers["traceparent"] == traceparent
    assert "traceparent" not in records[-1].headers


def test_undeliverable_events_surface_from_flush(kafka_broker: LocalKafka) -> None:
    conf = {**kafka_broker.client_config(), "message.timeout.ms": 1500}
    with (
        pytest.raises(DeliveryError, match="not delivered") as failed,
        Emitter(conf, topic=unique("no-such-topic")) as emitter,
    ):
        emitter.progress(workflow_key="wf", owner_epoch=1, worker_id="w")
    assert [f.workflow_key for f in failed.value.failures] == ["wf"]


def test_replay_rate_spreads_the_events_out(kafka_broker: LocalKafka, topic: str) -> None:
    lines = generated_history(keys=3)[:11]
    started = time.monotonic()
    result = splitbrain(
        "replay",
        "-",
        "--rate",
        "20",
        "--topic",
        topic,
        env=broker_env(kafka_broker),
        stdin="\n".join(lines) + "\n",
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 10 / 20  # 11 events, 10 gaps of 1/20 s at the least
    read_topic(kafka_broker, topic, len(lines))
