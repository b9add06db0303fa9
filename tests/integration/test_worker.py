"""`splitbrain worker`, both runtimes, against a real broker: the published history in, exactly
the findings `audit` computes out (read_committed); every poison record on the DLQ once; metrics
that count what was committed; and no revision lost or published twice when a worker is killed,
stopped or joined by another in the middle of its transactions.

Each test owns fresh topics and a fresh consumer group, runs its workers as subprocesses and
stops every process it started by PID. The `deployment` fixture runs each test once per runtime;
tests about restored state also run the kafka runtime on its RocksDB store.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from detector.contracts.events import parse_event_json
from detector.core import Detector, encode_state
from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import TopicReader, create_topics, quiescent, read_committed
from detector.devstack.worker import WorkerProcess
from detector.testing.torture.poison import corpus
from tests.integration.conftest import deploy
from tests.integration.deployment import (
    PARTITIONS,
    RUNTIMES,
    Deployment,
    Finding,
    assert_each_revision_once,
    audited,
    fixture_lines,
    keyed,
    latest,
    wait_for,
)
from tests.paths import SEED_FIXTURE

WITH_STORES = [*RUNTIMES, "kafka-rocksdb"]
POISON = b'{"event_id": "poison-1", "kind": "lease_acq'  # truncated JSON
OPEN_FINDING = "sb-9132f5408be0d876ccd9"  # the fixture's finding that stays open, critical


def test_replay_then_tail_gives_what_audit_gives(deployment: Deployment) -> None:
    w = deployment.worker()
    replayed = deployment.cli("replay", str(SEED_FIXTURE), "--topic", deployment.topics.input)
    assert replayed.returncode == 0, replayed.stderr
    expected = list(audited(fixture_lines()).values())

    def tailed() -> list[dict[str, object]]:
        out = deployment.cli(
            "tail",
            *("--from-beginning", "--format", "json", "--idle-timeout", "2"),
            *("--topic", deployment.topics.findings),
        )
        return [json.loads(line) for line in out.stdout.splitlines()]

    wait_for(lambda: tailed() == expected, "the worker's findings to equal audit's", workers=[w])
    assert w.stop() == 0  # SIGTERM: commit and leave the group cleanly
    log = w.log.read_text()
    assert f"finding {OPEN_FINDING} rev 4 critical open" in log
    assert "export-ledger" not in log  # logs carry ids and hashes, not workflow keys


def test_findings_dead_letters_and_metrics_once(deployment: Deployment) -> None:
    lines = fixture_lines()
    expected = audited(lines)
    started = time.time()
    w = deployment.worker()
    deployment.publish([*keyed(lines), (b"export-ledger", POISON)])
    admin = AdminClient(deployment.config)
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_audit(findings, expected, [w])
        wait_for(lambda: quiescent(admin, deployment.topics), "the group to commit it all")
        findings.read_to_end()
        assert latest(findings.records) == expected
        assert_each_revision_once(findings.records)
        assert_metrics_count(w, lines, len(findings.records), started)
    assert w.stop() == 0, w.tail()

    dead = read_committed(deployment.config, deployment.topics.dlq)
    assert [(d.key, d.value) for d in dead] == [(b"export-ledger", POISON)]
    assert dead[0].headers["error.reason"].startswith(b"invalid"), dead[0].headers
    assert dead[0].headers["source.topic"] == deployment.topics.input.encode()
    # Each finding went to the partition of the events it is about (co-partitioned).
    source = {
        r.key: r.partition for r in read_committed(deployment.config, deployment.topics.input)
    }
    assert all(source[r.key] == r.partition for r in findings.records)


def many_keys_then_a_commit() -> list[bytes]:
    """Issue 33's poison pill, a valid history: the displaced owner attempts 25 effect keys, then
    commits one more that sorts after them. It crashed the engine, and the worker at each
    restart, until someone deleted the event by hand."""

    def line(eid: str, kind: str, epoch: int, seq: int, **more: str) -> bytes:
        doc = {"event_id": eid, "kind": kind, "workflow_key": "many-keys", "owner_epoch": epoch}
        return json.dumps(doc | {"worker_id": f"w{epoch}", "seq": seq} | more).encode()

    attempts = [
        line(f"t{i:02}", "effect_attempted", 1, 3 + i, effect_key=f"k{i:02}") for i in range(25)
    ]
    return [
        line("a1", "lease_acquired", 1, 1, source="coordinator"),
        line("a2", "lease_acquired", 2, 2, source="coordinator"),
        *attempts,
        line("c", "effect_committed", 1, 40, effect_key="z-last", source="destination"),
    ]


def test_a_commit_among_many_keys_is_found_by_the_worker_as_by_audit(
    deployment: Deployment,
) -> None:
    lines = many_keys_then_a_commit()
    expected = audited(lines)
    (critical,) = [f for f in expected.values() if f["severity"] == "critical"]
    assert critical["effect_keys"][0] == "z-last"
    w = deployment.worker()
    deployment.publish(keyed(lines))
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_audit(findings, expected, [w])
        assert_each_revision_once(findings.records)
    assert w.stop() == 0, w.tail()


def wait_for_audit(
    findings: TopicReader, expected: dict[str, Finding], workers: list[WorkerProcess]
) -> None:
    def seen() -> bool:
        findings.poll(0.2)
        return latest(findings.records) == expected

    try:
        wait_for(seen, "the findings audit gives", workers=workers)
    except AssertionError as exc:
        raise AssertionError(f"{difference(latest(findings.records), expected)}\n{exc}") from None


def difference(seen: dict[str, Finding], expected: dict[str, Finding]) -> str:
    """What a reader saw against what audit gives: missing and extra findings, and the fields
    of the first finding whose latest revision differs."""
    missing, extra = sorted(expected.keys() - seen.keys()), sorted(seen.keys() - expected.keys())
    lines = [f"missing {len(missing)} {missing[:3]}, extra {len(extra)} {extra[:3]}"]
    for fid in sorted(expected.keys() & seen.keys()):
        if seen[fid] != expected[fid]:
            fields = expected[fid].keys() | seen[fid].keys()
            differ = {k: (seen[fid].get(k), expected[fid].get(k)) for k in sorted(fields)}
            lines.append(
                f"{fid} (seen, audit): " + repr({k: v for k, v in differ.items() if v[0] != v[1]})
            )
            break
    return "\n".join(lines)


def assert_metrics_count(
    w: WorkerProcess, lines: list[bytes], revisions: int, started: float
) -> None:
    """/metrics count what was committed, with bounded labels only; the worker was started at
    Unix time `started`."""
    # A commit is counted just after the broker took it: wait for the last one to be counted.
    wait_for(lambda: committed_events(w) == len(lines) + 1, "every event to be counted")
    samples = w.metrics()
    assert w.samples("splitbrain_events_total", "kind") == Counter(
        parse_event_json(line).kind.value for line in lines
    )
    dead = w.samples("splitbrain_dlq_messages_total", "reason")
    assert {reason: n for reason, n in dead.items() if n} == {"invalid": 1.0}, dead
    assert sum(w.samples("splitbrain_finding_revisions_total", "severity").values()) == revisions
    assert not samples.get(("splitbrain_transactions_total", (("outcome", "aborted"),)))
    workflows = len({parse_event_json(line).workflow_key for line in lines})
    wait_for(
        lambda: sum(w.samples("splitbrain_state_workflows", "partition").values()) == workflows,
        "the state gauge to count every workflow",
    )
    assert samples[("splitbrain_state_restore_seconds_count", ())] >= 1
    label_values = {v for _, labels in samples for _, v in labels}
    assert not {v for v in label_values if "export-ledger" in v}, label_values
    # Liveness and lag: the last poll time advances, every partition with events is at lag 0.
    first_poll = samples[("splitbrain_worker_last_poll_timestamp_seconds", ())]
    assert started <= first_poll <= time.time()  # a Unix time, of this run
    wait_for(lambda: last_poll(w) > first_poll, "the last-poll time to advance", 15)
    wait_for(lambda: not any(lags(w).values()) and bool(lags(w)), "every lag to reach 0")
    open_now = {"critical": 1.0, "warning": 0.0, "info": 0.0}
    wait_for(lambda: w.samples("splitbrain_findings_open", "severity") == open_now, "open gauge")


def committed_events(w: WorkerProcess) -> float:
    counted = w.samples("splitbrain_events_total", "kind")
    return sum(counted.values()) + sum(w.samples("splitbrain_dlq_messages_total", "").values())


def last_poll(w: WorkerProcess) -> float:
    return w.samples("splitbrain_worker_last_poll_timestamp_seconds", "").get("", 0.0)


def lags(w: WorkerProcess) -> dict[str, float]:
    return w.samples("splitbrain_consumer_lag_records", "partition")


def test_every_poison_record_lands_on_the_dlq_once(deployment: Deployment) -> None:
    w = deployment.worker()
    records = corpus(largest_value=1_000_000)
    producer = Producer(
        {**deployment.config, "message.max.bytes": 4 << 20, "partitioner": "murmur2_random"}
    )
    for _, key, value in records:
        producer.produce(deployment.topics.input, key=key, value=value)
    producer.produce(deployment.topics.input, key=b"export-ledger", value=fixture_lines()[0])
    assert producer.flush(30) == 0

    def dead_letters() -> int:
        return len(read_committed(deployment.config, deployment.topics.dlq))

    wait_for(lambda: dead_letters() >= len(records), "all dead letters", workers=[w])
    dead = read_committed(deployment.config, deployment.topics.dlq)
    sources = {(d.headers["source.partition"], d.headers["source.offset"]) for d in dead}
    assert len(dead) == len(records) == len(sources)
    assert all(d.headers["source.topic"] == deployment.topics.input.encode() for d in dead)
    assert all(d.headers["error.reason"] for d in dead)
    by_record = {(d.key, d.value): d.headers for d in dead}
    _, key, value = next(r for r in records if r[0] == "key_mismatch")
    mismatch = by_record[(key, value or b"")]
    assert mismatch["error.reason"].startswith(b"key_mismatch")
    assert mismatch["error.field"] == b"workflow_key"
    wait_for(
        lambda: w.samples("splitbrain_events_total", "kind").get("lease_acquired") == 1.0,
        "the valid event to be counted",
    )
    dead_by_reason = w.samples("splitbrain_dlq_messages_total", "reason")
    assert sum(dead_by_reason.values()) == len(records), dead_by_reason
    assert dead_by_reason["too_large"] >= 1 and dead_by_reason["key_mismatch"] >= 1


@pytest.mark.parametrize("deployment", WITH_STORES, indirect=True)
def test_a_finding_resolved_by_silence_is_not_republished_after_a_restart(
    deployment: Deployment,
) -> None:
    w = deployment.worker("w1", "--quiet-period-s", "1")
    events = [(1, 1, "lease_acquired"), (2, 2, "lease_acquired"), (3, 1, "progress")]
    deployment.publish(
        (b"quiet-wf", event(f"q{seq}", kind, "quiet-wf", epoch, seq)) for seq, epoch, kind in events
    )

    def revisions() -> list[tuple[int, str]]:
        nudge(deployment)
        docs = [json.loads(r.value) for r in read_committed(deployment.config, findings_topic)]
        return sorted((d["revision"], d["status"]) for d in docs)

    findings_topic = deployment.topics.findings
    # the worker lets time pass every few seconds: the silent zombie counts as fenced
    resolved = [(1, "open"), (2, "resolved")]
    wait_for(lambda: revisions() == resolved, "quiet resolution", workers=[w])
    assert w.stop() == 0
    w.start()  # restores from the changelog, then lets time pass again
    wait_for(lambda: "restored partitions" in w.log.read_text(), "the restart", workers=[w])
    nudge(deployment)
    # the state gauge is first set by the restarted worker's first pass of time
    wait_for(lambda: bool(w.samples("splitbrain_state_workflows", "partition")), "a tick")
    assert revisions() == resolved


FORGET_SOON = ("--quiet-period-s", "1", "--idle-ttl-s", "2", "--idle-sweep-s", "1")
Revisions = Callable[[], list[tuple[str, int, str]]]


@pytest.mark.parametrize("deployment", ["kafka", "kafka-rocksdb"], indirect=True)
def test_a_forgotten_finding_goes_on_at_its_next_revision_after_a_restart(
    deployment: Deployment,
) -> None:
    """An idle workflow whose finding resolved is forgotten down to what the finding's later
    revisions need; that remnant is on the changelog, so after a restart new stale evidence
    continues the finding under its id at the next revision, never at a published one."""
    w = deployment.worker("w1", *FORGET_SOON)
    revisions = forget_a_resolved_finding(deployment, w)
    assert w.stop() == 0
    w.start()  # restores the remnant from the changelog
    wait_for(lambda: "restored partitions" in w.log.read_text(), "the restart", workers=[w])
    assert_goes_on_at_its_next_revision(deployment, revisions, w)


@pytest.mark.parametrize("deployment", ["kafka", "kafka-rocksdb"], indirect=True)
def test_a_forgotten_finding_goes_on_at_its_next_revision_after_a_rebalance(
    deployment: Deployment,
) -> None:
    """The same when the workflow's partition moves to another member of the group: the member
    that takes it restores the remnant from the changelog, not from the first one's memory."""
    w1 = deployment.worker("w1", *FORGET_SOON)
    revisions = forget_a_resolved_finding(deployment, w1)
    w2 = deployment.worker("w2", *FORGET_SOON)
    wait_for(lambda: "restored partitions" in w2.log.read_text(), "w2 to join", workers=[w1, w2])
    assert w1.stop() == 0  # leaves the group: every partition moves to w2
    assert_goes_on_at_its_next_revision(deployment, revisions, w2)
    assert "finding " in w2.log.read_text()  # published by the member that took the partition


def forget_a_resolved_finding(deployment: Deployment, w: WorkerProcess) -> Revisions:
    """A takeover of `idle-wf` and one event of its zombie: the finding opens, resolves once
    the zombie is quiet, and `w` forgets the idle workflow. Returns the findings' reader."""
    events = [(1, 1, "lease_acquired"), (2, 2, "lease_acquired"), (3, 1, "progress")]
    deployment.publish(
        (b"idle-wf", event(f"i{seq}", kind, "idle-wf", epoch, seq)) for seq, epoch, kind in events
    )
    findings_topic = deployment.topics.findings

    def revisions() -> list[tuple[str, int, str]]:
        docs = [json.loads(r.value) for r in read_committed(deployment.config, findings_topic)]
        return sorted((d["finding_id"], d["revision"], d["status"]) for d in docs)

    def forgotten() -> bool:
        return w.samples("splitbrain_state_evictions_total", "cause").get("idle", 0) >= 1

    wait_for(lambda: [r[1:] for r in revisions()] == [(1, "open"), (2, "resolved")], "quiet")
    wait_for(forgotten, "the idle workflow forgotten", workers=[w])
    return revisions


def assert_goes_on_at_its_next_revision(
    deployment: Deployment, revisions: Revisions, w: WorkerProcess
) -> None:
    """New stale evidence on the forgotten workflow: revision 3 of the same finding (and, once
    the zombie is quiet for the second's short quiet period, revision 4 resolves it again)."""
    later = [(4, 3, "lease_acquired"), (5, 1, "progress")]
    deployment.publish(
        (b"idle-wf", event(f"i{seq}", kind, "idle-wf", epoch, seq)) for seq, epoch, kind in later
    )
    wait_for(lambda: len(revisions()) >= 3, "the next revision", workers=[w])
    (finding_id, *_), *_ = found = revisions()
    goes_on = [(finding_id, 1, "open"), (finding_id, 2, "resolved"), (finding_id, 3, "open")]
    assert found in (goes_on, [*goes_on, (finding_id, 4, "resolved")])


def nudge(deployment: Deployment) -> None:
    """The faust runtime lets time pass in a partition only when an event of it arrives (ADR
    0003, known limits): give each partition an event of its own workflow."""
    if deployment.runtime == "faust":
        for p in range(PARTITIONS):
            key = f"nudge-{p}"
            doc = event(f"n-{time.monotonic_ns()}", "heartbeat", key, 1, None)
            deployment.publish([(key.encode(), doc)], partition=p)


def event(event_id: str, kind: str, key: str, epoch: int, seq: int | None) -> bytes:
    doc = {"event_id": event_id, "kind": kind, "workflow_key": key, "owner_epoch": epoch}
    doc |= {"worker_id": f"w{epoch}"} | ({} if seq is None else {"seq": seq})
    return json.dumps(doc).encode()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigterm_stops_the_worker_even_with_the_broker_down(runtime: str, tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path / "kafka")  # its own: this test kills it
    broker.start()
    d = deploy(broker, tmp_path, runtime)
    try:
        w = d.worker()
        wait_for(lambda: "restored partitions" in w.log.read_text(), "the start", workers=[w])
        broker.kill()
        # bounded by the transaction timeout and the group leave, not by the broker's return
        code = w.stop(timeout=90)
        assert code in (0, 1), w.tail()
    finally:
        d.close()
        broker.stop()


# ---- in the middle of the stream -----------------------------------------------------------


def many_workflows(copies: int) -> list[bytes]:
    """The fixture's workflows, `copies` times over under distinct keys and event ids."""
    base = [json.loads(line) for line in fixture_lines()]
    return [
        json.dumps(
            ev | {"workflow_key": f"{ev['workflow_key']}#{n}", "event_id": f"{ev['event_id']}-{n}"}
        ).encode()
        for n in range(copies)
        for ev in base
    ]


def trickle(deployment: Deployment, lines: list[bytes]) -> threading.Thread:
    """Publish in small batches from a thread, so workers are mid-stream when a test acts."""

    def send() -> None:
        records = keyed(lines)
        for i in range(0, len(records), 100):
            deployment.publish(records[i : i + 100])
            time.sleep(0.05)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def assert_exactly_once(
    deployment: Deployment,
    findings: TopicReader,
    expected: dict[str, Finding],
    workers: list[WorkerProcess],
) -> None:
    """Once the input is done: the latest revisions equal audit's, and each revision was
    published once."""
    admin = AdminClient(deployment.config)
    wait_for_audit(findings, expected, workers)
    wait_for(lambda: quiescent(admin, deployment.topics), "the group to commit it all")
    findings.read_to_end()
    assert latest(findings.records) == expected
    assert_each_revision_once(findings.records)


def wait_for_findings(findings: TopicReader, count: int, w: WorkerProcess) -> None:
    def enough() -> bool:
        findings.poll(0.2)
        return len(findings.records) >= count

    wait_for(enough, f"{count} finding revisions", workers=[w])


def through_a_fault(
    deployment: Deployment, first: WorkerProcess, fault: Callable[[], list[WorkerProcess]]
) -> tuple[int, int]:
    """Publish many workflows in the background; once `first` published some revisions, run
    `fault`, which returns the workers that finish the stream. Then the latest revisions must
    equal audit's, each published once, and every finishing worker must stop cleanly. The
    revisions published before the fault and in all."""
    lines = many_workflows(150)
    expected = audited(lines)
    sender = trickle(deployment, lines)
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_findings(findings, 60, first)
        before = len(findings.records)
        finishing = fault()
        sender.join(timeout=60)
        assert not sender.is_alive()
        assert_exactly_once(deployment, findings, expected, finishing)
        for w in reversed(finishing):
            assert w.stop() == 0, w.tail()
    return before, len(findings.records)


@pytest.mark.parametrize("deployment", WITH_STORES, indirect=True)
def test_sigkill_mid_stream_loses_and_duplicates_nothing(deployment: Deployment) -> None:
    """kill -9 while transactions are open, restart: read_committed readers see each revision
    once and the final revisions equal the offline audit."""
    w = deployment.worker()

    def kill_and_restart() -> list[WorkerProcess]:
        w.kill()  # open transactions stay open until the restart fences them
        return [w.start()]

    before, after = through_a_fault(deployment, w, kill_and_restart)
    assert before < after, "the kill came after all the work"


@pytest.mark.parametrize("deployment", ["kafka"], indirect=True)
def test_a_second_process_of_the_same_instance_fences_the_first(deployment: Deployment) -> None:
    """Two processes of one instance id (a botched deploy): the newer one's transactional id
    fences the older one, which exits 3 (fenced on a transaction younger than its timeout, it
    is not its coordinator's doing); readers still see every revision exactly once."""
    old = deployment.worker()
    twin = WorkerProcess(
        deployment.config, deployment.topics, deployment.group.workdir / "twin", old.instance
    )

    def start_twin() -> list[WorkerProcess]:
        twin.start()
        wait_for(lambda: not old.alive(), "the older process to stop", workers=[twin])
        assert old.exit_code() == 3, old.tail()
        return [twin]

    try:
        through_a_fault(deployment, old, start_twin)
    finally:
        twin.kill()


def test_a_transaction_timeout_the_brokers_refuse_stops_the_worker_naming_the_flag(
    kafka_deployment: Deployment,
) -> None:
    """Above the brokers' transaction.max.timeout.ms (15 min by default) the broker refuses the
    worker's transactions: it says which setting, and exits 2 (unusable), without a traceback."""
    w = kafka_deployment.worker("w1", "--transaction-timeout-ms", "900001")
    wait_for(lambda: not w.alive(), "the worker's exit")
    log = w.log.read_text()
    assert w.exit_code() == 2, log
    assert (
        "cannot start the worker: the brokers refuse --transaction-timeout-ms "
        "(SPLITBRAIN_TRANSACTION_TIMEOUT_MS) 900001, above their transaction.max.timeout.ms"
    ) in log, log
    assert "Traceback" not in log, log


def test_scale_out_moves_state_with_partitions(deployment: Deployment) -> None:
    """A second worker joins mid-stream: partitions and their state move to it through the
    changelog, the first worker's producers for them are fenced, and readers still see every
    revision exactly once."""
    a = deployment.worker("a")
    joined: list[WorkerProcess] = []

    def scale_out() -> list[WorkerProcess]:
        joined.append(deployment.worker("b"))
        return [a, *joined]

    through_a_fault(deployment, a, scale_out)
    assert "finding " in joined[0].log.read_text(), "the second worker never got a partition"


def test_sigterm_mid_stream_commits_what_it_did_and_resumes(deployment: Deployment) -> None:
    """A deploy: SIGTERM while events are flowing exits 0 after committing the events it
    finished; the next worker resumes from there without repeating a revision."""
    old = deployment.worker("old")
    new: list[WorkerProcess] = []

    def redeploy() -> list[WorkerProcess]:
        assert old.stop() == 0, old.tail()
        new.append(deployment.worker("new"))
        return new

    through_a_fault(deployment, old, redeploy)
    assert "finding " in new[0].log.read_text(), "the old worker finished everything first"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sasl_ssl_scram_connection(
    runtime: str, kafka_sasl_broker: LocalKafka, tmp_path: Path
) -> None:
    """librdkafka's SASL_SSL + SCRAM-SHA-512 + CA settings reach the runtime's client intact."""
    d = deploy(kafka_sasl_broker, tmp_path, runtime)
    try:
        lines = fixture_lines()
        expected = audited(lines)
        w = d.worker()
        d.publish(keyed(lines))
        with d.reader(d.topics.findings) as findings:
            wait_for_audit(findings, expected, [w])
            assert_each_revision_once(findings.records)
        assert w.stop() == 0, w.tail()
    finally:
        d.close()


@pytest.mark.parametrize("deployment", WITH_STORES, indirect=True)
def test_a_restore_loads_the_previous_owners_last_commit_even_before_it_is_marked(
    deployment: Deployment,
) -> None:
    """The previous owner's last transaction, acknowledged to it but not yet marked on the
    changelog by the coordinator, is invisible to a read_committed reader for a moment, exactly
    like an open one. A restore that stopped there would judge the next events without the
    takeover that transaction recorded. Here the transaction is held open (as a paused zombie's
    would be) while the worker restores, and committed afterwards: the stale event that follows
    must still be judged against the takeover."""
    key = "handoff-wf"
    history = [
        event("h1", "lease_acquired", key, 17, 1),
        event("h2", "lease_acquired", key, 18, 2),
    ]
    stale = event("h3", "progress", key, 17, 3)
    previous = Detector()
    for line in history:
        previous.observe(parse_event_json(line))
    changelog = NewTopic(
        deployment.topics.changelog, PARTITIONS, 1, config={"cleanup.policy": "compact"}
    )
    create_topics(deployment.config, [changelog])
    owner = Producer({**deployment.config, "transactional.id": f"{deployment.topics.group}-prev"})
    owner.init_transactions(30)
    owner.begin_transaction()
    owner.produce(
        deployment.topics.changelog,
        key=key.encode(),
        value=encode_state(previous.states[key]),
        partition=0,
    )
    owner.flush(30)

    w = deployment.worker()
    wait_for(
        lambda: any(s in w.log.read_text() for s in ("is undecided", "restored partitions")),
        "the restore to reach the undecided transaction (or to end before it)",
        workers=[w],
    )
    owner.commit_transaction(30)
    deployment.publish([(key.encode(), stale)], partition=0)
    expected = audited([*history, stale])
    assert len(expected) == 1
    with deployment.reader(deployment.topics.findings) as findings:
        wait_for_audit(findings, expected, [w])
    assert w.stop() == 0, w.tail()
