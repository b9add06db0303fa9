"""The torture harness: publish a history, run real detector workers, inject faults, then judge.

Runtime-agnostic: workers are `splitbrain worker --runtime R` processes. The judge reads the
findings topic with read_committed and compares it with `audit` of the same history (the
oracle): no finding missing, none extra, no (finding_id, revision) published twice, the latest
revision of every finding equal to the oracle's; the group's committed offsets at the input's
end; no transaction left open; every poison record on the DLQ exactly once.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from detector.core import Config
from detector.devstack.kafka_cluster import LocalKafkaCluster
from detector.devstack.topics import (
    WorkerTopics,
    lagging_partitions,
    open_transactions,
    quiescent,
    read_committed,
)
from detector.devstack.worker import WorkerGroup, WorkerProcess
from detector.histories.audit import audit_lines
from detector.testing.torture.history import generate
from detector.testing.torture.poison import corpus

STALL_LINE = b"stalled on Kafka"  # what detector.runtime.stall logs
QUIET_S = 86_400.0  # the quiet period never elapses during a run: oracle and stream agree on time
SESSION_TIMEOUT_S = 10.0  # the worker's consumer session timeout (see kafka_loop)


@dataclass
class Report:
    events: int = 0
    poison: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    oracle_findings: int = 0
    published_revisions: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    duplicate_revisions: list[tuple[str, int]] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    differences: dict[str, list[str]] = field(default_factory=dict)  # by mismatched finding
    lagging_partitions: list[int] = field(default_factory=list)
    open_transactions: list[str] = field(default_factory=list)
    dlq_problems: list[str] = field(default_factory=list)
    stall_problems: list[str] = field(default_factory=list)  # C6: committed while stalled
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not (
            self.missing
            or self.extra
            or self.duplicate_revisions
            or self.mismatched
            or self.lagging_partitions
            or self.open_transactions
            or self.dlq_problems
            or self.stall_problems
        )

    def render(self) -> str:
        lines = [
            f"events published: {self.events} (+{self.poison} poison)",
            f"faults injected: {dict(self.faults)}",
            f"oracle findings: {self.oracle_findings}; revisions published: "
            f"{self.published_revisions}",
            f"missing findings: {len(self.missing)} {self.missing[:5]}",
            f"extra findings: {len(self.extra)} {self.extra[:5]}",
            f"duplicate revisions: {len(self.duplicate_revisions)} {self.duplicate_revisions[:5]}",
            f"latest revision differs from oracle: {len(self.mismatched)} {self.mismatched[:5]}",
            *(
                f"  {fid} {difference}"
                for fid in self.mismatched[:3]
                for difference in self.differences.get(fid, [])
            ),
            f"partitions with committed offset short of the end: {self.lagging_partitions}",
            f"open transactions (LSO < high watermark): {self.open_transactions}",
            f"DLQ problems: {len(self.dlq_problems)} {self.dlq_problems[:5]}",
            f"stall problems (two brokers down): {self.stall_problems}",
            f"elapsed: {self.seconds:.1f}s",
            "RESULT: " + ("PASS" if self.passed else "FAIL"),
        ]
        return "\n".join(lines)


class Harness:
    def __init__(
        self,
        config: Mapping[str, Any],
        workdir: Path,
        runtime: str = "kafka",
        partitions: int = 6,
        tag: str = "torture",
        seed: int = 7,
        store: str = "memory",
        replication: int = 1,
        worker_flags: Sequence[str] = (),  # every worker's, after the harness's own
    ) -> None:
        self.config = dict(config)  # librdkafka client settings: bootstrap servers, security
        self.workdir = workdir
        self.runtime = runtime
        self.store = store
        self.partitions = partitions
        self.replication = replication
        self.rng = random.Random(seed)
        self.topics = WorkerTopics.fresh(tag)
        self.admin = AdminClient(self.config)
        self.group = WorkerGroup(
            self.config,
            self.topics,
            workdir,
            runtime,
            store,
            extra=("--quiet-period-s", str(QUIET_S), *worker_flags),
        )
        self.report = Report()
        workdir.mkdir(parents=True, exist_ok=True)

    # ---- setup ---------------------------------------------------------------------------------

    def create_topics(self) -> None:
        self.topics.create(self.config, self.partitions, replication=self.replication)

    def worker(self, instance: str) -> WorkerProcess:
        return self.group.worker(instance, metrics=True)

    # ---- publishing ----------------------------------------------------------------------------

    def publish(
        self,
        lines: list[bytes],
        poison_every: int = 0,
        rate: float = 0.0,
    ) -> None:
        """Produce the history in order (per-key order kept), poison interleaved."""
        producer = Producer(
            {
                **self.config,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",
                "linger.ms": 10,
                "message.max.bytes": 4 * 1024 * 1024,
            }
        )
        bad = iter(corpus(largest_value=1_000_000)) if poison_every else iter(())
        started = time.monotonic()
        for i, line in enumerate(lines):
            doc = json.loads(line)
            producer.produce(self.topics.input, key=doc["workflow_key"].encode(), value=line)
            self.report.events += 1
            if poison_every and i % poison_every == poison_every - 1:
                record = next(bad, None)
                if record is not None:
                    _, key, value = record
                    producer.produce(self.topics.input, key=key, value=value)
                    self.report.poison += 1
            producer.poll(0)
            if rate and i % 100 == 0:
                ahead = i / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        for _, key, value in bad if poison_every else ():
            producer.produce(self.topics.input, key=key, value=value)
            self.report.poison += 1
        remaining = producer.flush(60)
        assert remaining == 0, f"{remaining} records not delivered"

    # ---- waiting and judging -------------------------------------------------------------------

    def wait_quiescent(self, deadline_s: float, supervise: Callable[[], None]) -> None:
        """Until the group has committed the whole input and no transaction is open."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            supervise()
            if quiescent(self.admin, self.topics):
                return
            time.sleep(1.0)

    def judge(self, lines: list[bytes]) -> Report:
        r = self.report
        oracle = audit_lines(lines, config=Config(quiet_period_s=QUIET_S)).findings
        r.oracle_findings = len(oracle)
        latest: dict[str, dict[str, Any]] = {}
        seen: set[tuple[str, int]] = set()
        for record in read_committed(self.config, self.topics.findings, timeout=300):
            doc = json.loads(record.value)
            pair = (doc["finding_id"], doc["revision"])
            if pair in seen:
                r.duplicate_revisions.append(pair)
            seen.add(pair)
            r.published_revisions += 1
            if (
                doc["finding_id"] not in latest
                or doc["revision"] > latest[doc["finding_id"]]["revision"]
            ):
                latest[doc["finding_id"]] = doc
        r.missing = sorted(set(oracle) - set(latest))
        r.extra = sorted(set(latest) - set(oracle))
        for fid in sorted(set(oracle) & set(latest)):
            differences = _differences(json.loads(oracle[fid].to_json()), latest[fid])
            if differences:
                r.mismatched.append(fid)
                r.differences[fid] = differences
        r.lagging_partitions = lagging_partitions(self.admin, self.topics)
        outputs = (self.topics.findings, self.topics.dlq, self.topics.changelog)
        r.open_transactions = open_transactions(self.admin, outputs)
        self._judge_dlq()
        return r

    def _judge_dlq(self) -> None:
        r = self.report
        sources: Counter[tuple[str, str]] = Counter()
        for h in (rec.headers for rec in read_committed(self.config, self.topics.dlq)):
            if h.get("error.reason", b"") == b"":
                r.dlq_problems.append("a dead letter without error.reason")
            sources[(h["source.partition"].decode(), h["source.offset"].decode())] += 1
        twice = [s for s, n in sources.items() if n > 1]
        if twice:
            r.dlq_problems.append(f"{len(twice)} poison records dead-lettered more than once")
        if sum(sources.values()) - len(twice) != r.poison:
            r.dlq_problems.append(f"{len(sources)} distinct dead letters for {r.poison} poison")

    def stop_all(self) -> None:
        self.group.stop_all()


def _differences(oracle: Mapping[str, Any], stream: Mapping[str, Any]) -> list[str]:
    """Each field where the stream's latest revision differs from the oracle's final one."""
    return [
        f"{name}: oracle {oracle.get(name)!r}, stream {stream.get(name)!r}"
        for name in sorted(oracle.keys() | stream.keys())
        if oracle.get(name) != stream.get(name)
    ]


# ---- fault plans ----------------------------------------------------------------------------


@dataclass
class Plan:
    """How many of each fault, and how long a run may take."""

    events: int = 20_000
    kills: int = 5  # F1
    terms: int = 2  # F2
    zombies: int = 1  # F3
    broker_kills: int = 1  # F4 (needs a broker handle)
    broker_pauses: int = 1  # F5 (needs a broker handle)
    storms: int = 10  # F6: add and remove a second worker this many times
    poison_every: int = 200  # F8
    wipe_state: bool = True  # F9
    rate: float = 400.0  # events/s published while faults run
    quiescence_s: float = 300.0
    # On a cluster (`LocalKafkaCluster`), F4/F5 become C1-C6 (`ClusterFaults`), each this often.
    cluster_rounds: int = 1
    stall_s: float = 90.0  # C6: how long two of three brokers stay down, at most


class FaultRun:
    """Publishes in the background while the plan's faults hit live workers, then judges."""

    def __init__(
        self, harness: Harness, plan: Plan, broker: Any | None, log: Callable[[str], None]
    ) -> None:
        self.h, self.plan, self.broker, self.log = harness, plan, broker, log
        self.r = harness.report
        self.w1 = harness.worker("w1")

    def supervise(self) -> None:
        """What a process supervisor does: a worker that exited (fenced, crashed) is restarted."""
        if not self.w1.alive():
            self.r.faults["supervisor restarts"] += 1
            self.log(f"supervisor: w1 had exited ({self.w1.exit_code()}); restarting it")
            self.restart(self.w1)

    def pause(self, lo: float, hi: float) -> None:
        time.sleep(self.h.rng.uniform(lo, hi))

    def restart(self, w: WorkerProcess) -> None:
        if self.plan.wipe_state:
            shutil.rmtree(w.state_dir, ignore_errors=True)
            self.r.faults["F9 state wiped"] += 1
        w.start()

    def kills(self) -> None:
        for _ in range(self.plan.kills):
            self.pause(1.0, 4.0)
            self.w1.kill()
            self.r.faults["F1 SIGKILL"] += 1
            self.log(f"F1 SIGKILL worker (kill {self.r.faults['F1 SIGKILL']})")
            self.restart(self.w1)

    def terms(self) -> None:
        for _ in range(self.plan.terms):
            self.pause(1.0, 3.0)
            code = self.w1.stop()
            self.r.faults["F2 SIGTERM"] += 1
            self.log(f"F2 SIGTERM worker: exit {code}")
            self.restart(self.w1)

    def zombies(self) -> None:
        for _ in range(self.plan.zombies):
            w2 = self.h.worker("w2")
            w2.start()
            self.pause(6.0, 8.0)  # both in the group, partitions shared
            self.w1.signal(signal.SIGSTOP)
            self.log("F3 SIGSTOP w1 past the session timeout")
            time.sleep(SESSION_TIMEOUT_S + 8.0)
            self.w1.signal(signal.SIGCONT)
            self.r.faults["F3 zombie"] += 1
            self.log("F3 SIGCONT w1 (zombie resumes)")
            self.pause(4.0, 6.0)
            self.supervise()
            w2.stop()

    def broker_faults(self) -> None:
        if self.broker is None:
            return
        if isinstance(self.broker, LocalKafkaCluster):
            ClusterFaults(self, self.broker)()
            return
        for _ in range(self.plan.broker_kills):
            self.pause(1.0, 3.0)
            self.broker.kill_and_restart()
            self.r.faults["F4 broker kill -9"] += 1
            self.log("F4 broker killed and restarted")
        for _ in range(self.plan.broker_pauses):
            self.pause(1.0, 3.0)
            self.broker.pause()
            time.sleep(12.0)
            self.broker.resume()
            self.r.faults["F5 broker SIGSTOP"] += 1
            self.log("F5 broker paused 12s")

    def storms(self) -> None:
        for _ in range(self.plan.storms):
            w2 = self.h.worker("w2")
            w2.start()
            self.pause(2.0, 4.0)
            w2.stop()
            self.r.faults["F6 rebalance"] += 1
        self.log(f"F6 rebalance storm: {self.plan.storms} joins and leaves")

    def __call__(self) -> Report:
        started = time.monotonic()
        lines = generate(self.plan.events)
        self.h.create_topics()
        self.w1.start()
        publisher = threading.Thread(
            target=self.h.publish,
            args=(lines, self.plan.poison_every, self.plan.rate),
            daemon=True,
        )
        publisher.start()
        try:
            for fault in (self.kills, self.terms, self.zombies, self.broker_faults, self.storms):
                fault()
            publisher.join()
            if self.plan.poison_every:
                self.r.faults["F8 poison"] = self.r.poison
            self.h.wait_quiescent(self.plan.quiescence_s, self.supervise)
            self.h.judge(lines)
        finally:
            self.h.stop_all()
        self.r.seconds = time.monotonic() - started
        return self.r


class ClusterFaults:
    """The faults of a three-broker cluster, under live workers and a live publisher.

    C1/C2 kill (SIGKILL) the leader of an input / changelog partition while transactions write
    to it; C3 kills the node coordinating w1's transactions; C4 pauses a node past its broker
    session timeout (3 s), so the controller fences it and moves its leaders, then resumes it
    (a zombie broker); C5 restarts every node in turn, as an operator's rolling restart; C6
    keeps two nodes down at once, so no write can reach `min.insync.replicas` (the KRaft quorum
    is lost too): the workers must commit nothing, say why, and resume on their own when a
    node returns.
    """

    def __init__(self, run: FaultRun, cluster: LocalKafkaCluster) -> None:
        self.run, self.cluster = run, cluster
        self.h, self.r, self.log = run.h, run.r, run.log

    def __call__(self) -> None:
        for _ in range(self.run.plan.cluster_rounds):
            self.two_down()  # first: while the input still flows, a resumption shows
            self.kill_leader("C1 input leader kill -9", self.h.topics.input)
            self.kill_leader("C2 changelog leader kill -9", self.h.topics.changelog)
            self.kill_coordinator()
            self.zombie_broker()
            self.rolling_restart()

    def _crash(self, fault: str, node_id: int, why: str) -> None:
        self.run.pause(1.0, 3.0)
        self.cluster.node(node_id).kill()
        started = time.monotonic()
        self.log(f"{fault}: broker {node_id} killed ({why})")
        self.run.pause(2.0, 5.0)  # the workers run on without it for a while
        self.cluster.restart(node_id)
        self.r.faults[fault] += 1
        self.log(f"{fault}: broker {node_id} back in sync after {time.monotonic() - started:.1f}s")

    def kill_leader(self, fault: str, topic: str) -> None:
        partition = self.h.rng.randrange(self.h.partitions)
        leader = self.cluster.leader(topic, partition)
        self._crash(fault, leader, f"leader of {topic}[{partition}]")

    def kill_coordinator(self) -> None:
        txn_id = f"{self.h.topics.group}-{self.run.w1.instance}"
        coordinator = self.cluster.transaction_coordinator(txn_id)
        self._crash("C3 coordinator kill -9", coordinator, f"coordinates {txn_id}")

    def zombie_broker(self) -> None:
        self.run.pause(1.0, 3.0)
        node_id = self.h.rng.choice(sorted(self.cluster.nodes))
        node = self.cluster.node(node_id)
        node.pause()
        self.log(f"C4 SIGSTOP broker {node_id} past its session timeout")
        time.sleep(12.0)
        node.resume()
        self.cluster.wait_in_sync()
        self.r.faults["C4 broker zombie"] += 1
        self.log(f"C4 SIGCONT broker {node_id}: back in sync")

    def rolling_restart(self) -> None:
        self.run.pause(1.0, 3.0)
        started = time.monotonic()
        self.cluster.rolling_restart()
        self.r.faults["C5 rolling restart"] += 1
        self.log(
            f"C5 rolling restart of {len(self.cluster.nodes)} brokers: "
            f"{time.monotonic() - started:.1f}s"
        )

    def two_down(self) -> None:
        """Two nodes killed at once; the workers must commit nothing until one returns."""
        self.run.pause(1.0, 3.0)
        down = self.h.rng.sample(sorted(self.cluster.nodes), 2)
        for node_id in down:
            self.cluster.node(node_id).kill()
        self.log(f"C6 brokers {down} killed: min.insync.replicas cannot be met")
        time.sleep(5.0)  # what was in flight fails or times out
        before = self._committed()
        said = self._wait_said(self.run.plan.stall_s)
        during = self._committed()
        if during[0] == before[0] and during[1] > before[1]:
            self.r.stall_problems.append(
                f"C6: {during[1] - before[1]:.0f} transactions committed with two brokers down"
            )
        polled = self.run.w1.samples("splitbrain_worker_last_poll_timestamp_seconds", "")
        age = time.time() - polled.get("", 0.0)
        self.log(f"C6 stalled: w1 said so: {said}; its last poll {age:.0f}s ago")
        if self.h.runtime == "kafka" and not said:
            self.r.stall_problems.append("C6: the worker's log does not say it stalled")
        self.cluster.restart(down[0])  # a quorum again: the workers must resume on their own
        self.log(f"C6 broker {down[0]} back; waiting for a commit")
        self._wait_commit_after(during)
        self.cluster.restart(down[1])
        self.r.faults["C6 two brokers down"] += 1
        self.log(f"C6 broker {down[1]} back: whole again")

    def _wait_said(self, timeout: float) -> bool:
        """Until w1's log says it stalled on Kafka (the kafka runtime's `StallWatch`)."""
        start = self.run.w1.log.stat().st_size if self.run.w1.log.exists() else 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.run.w1.log.open("rb") as fh:
                fh.seek(start)
                if STALL_LINE in fh.read():
                    return True
            time.sleep(1.0)
        return False

    def _committed(self) -> tuple[int | None, float]:
        """w1's process and the transactions it committed so far, by its /metrics."""
        proc = self.run.w1.proc
        samples = self.run.w1.samples("splitbrain_transactions_total", "outcome")
        return (None if proc is None else proc.pid), samples.get("committed", 0.0)

    def _wait_commit_after(self, mark: tuple[int | None, float], timeout: float = 180.0) -> None:
        """Until w1 commits past `mark` (or, restarted by the supervisor, commits at all)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.run.supervise()
            pid, count = self._committed()
            if count > (mark[1] if pid == mark[0] else 0.0):
                return
            time.sleep(1.0)
        self.r.stall_problems.append(f"C6: no commit within {timeout:.0f}s of a broker's return")


def run(
    harness: Harness, plan: Plan, broker: Any | None = None, log: Callable[[str], None] = print
) -> Report:
    return FaultRun(harness, plan, broker, log)()
