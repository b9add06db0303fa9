"""Recovery of `splitbrain worker` from a SIGKILL, with 10⁶ workflow states in its changelog.

Why: a worker processes nothing of a partition until it has read the partition's whole changelog,
so the restore is how long a crashed worker leaves split-brains unseen. Target: ≤ 15 s from the
SIGKILL and restart to processing again, at 10⁶ workflows.

The changelog is filled directly, not by a worker (which would need minutes and write a record
per batch that touched a workflow): bench_engine's history, a few events per workflow, goes
through the worker's own step (`PartitionProcessor.process`, at the wall-clock time), and each
resulting state is written `encode_state`d under its workflow key by a transactional producer,
lz4, a transaction per 5,000 records, as a worker writes it. So the restore reads real states;
the changelog holds one record per workflow, as after compaction (a live changelog also holds the
superseded records of its uncompacted tail, which a restore reads too). With --distinct N, only
N workflows go through the step and their encoded states are written again under renamed keys
up to --workflows (a state holds no key): the same records to restore, filled in a fraction of
the time on a loaded machine.

Processing again: a finding a probe opens is visible to a read_committed consumer of the findings
topic, so the probe went through the rules and its transaction committed. Two probes are
published between the SIGKILL and the restart: a takeover and a stale commit on a fresh workflow,
and a lone stale commit on a restored workflow whose takeover only its restored state holds (its
finding shows that the restored state is the one in use). The group's committed offsets passing
the probes (same transaction) are sampled too. Prints numbers; asserts nothing.

With --standby: two workers with `--standby all`; once the one that does not own partition 0 has
caught its standby up, the owner is SIGKILLed and not restarted, and the survivor's takeover is
timed from the SIGKILL (the dead member's session, the rebalance, the restore of the changelog's
tail, the first batch) with the same probes. Target: ≤ 2 s of restore for the takeover. With
--feed R, bench_engine's history is published at about R events/s from 20 s before the SIGKILL
until the survivor processes again, so that the survivor is busy (with --partitions 2, on a
partition of its own) when the group revokes and assigns. With --held-transaction, the owner
is killed inside a commit, its states written in a transaction that nobody commits
(`detector.testing.stalling_worker`): the survivor's restore of its partitions waits until the
coordinator aborts that transaction at its timeout.
Run: `python bench/bench_recovery.py [--workflows N] [--partitions N] [--store memory|rocksdb]
[--standby [--feed R] [--held-transaction]]`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench_engine import _event, history
from bench_worker import produce, publish, topic_bytes, workflow_key
from confluent_kafka import Consumer, IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from stack import broker_with_topics, machine, start_worker, vm_kb

from detector.core import Detector, WorkflowState, encode_state
from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from detector.devstack.topics import TopicReader, WorkerTopics, create_topics, end_offsets
from detector.devstack.worker import WorkerProcess
from detector.runtime.kafka_loop import CHANGELOG_CONFIG
from detector.runtime.processor import PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics
from detector.testing.stalling_worker import COMMIT_MARK

CHUNK: Final = 20_000  # workflows per engine while filling: memory stays that of one chunk
TXN_RECORDS: Final = 5_000  # changelog records per fill transaction: the worker's default batch
TARGET_S: Final = 15.0
STANDBY_TARGET_S: Final = 2.0  # restore seconds of a standby's takeover
_LOG_TIME: Final = "%Y-%m-%d %H:%M:%S,%f"  # the worker's asctime
_RESTORED: Final = re.compile(r"restored partitions \[([0-9, ]*)\] in ([0-9.]+)s: (\d+) changelog")


def tagged(lines: list[bytes], tag: str) -> list[bytes]:
    """History lines with their workflows and event ids renamed by `tag`, so that histories of
    several seeds (or one seed several times) share no workflow and no event id."""
    workflow, event = f"/export/{tag}-".encode(), f'"ev-{tag}-'.encode()
    return [raw.replace(b"/export/", workflow, 1).replace(b'"ev-', event, 1) for raw in lines]


@dataclass(frozen=True, slots=True)
class Stale:
    """A restored workflow taken over once: a commit of its displaced epoch opens a finding only
    with the takeover its restored state holds."""

    key: str
    epoch: int  # the displaced one
    worker: str
    seq: int

    @classmethod
    def among(cls, states: Mapping[str, WorkflowState]) -> Stale | None:
        for key, st in states.items():
            displaced = [a for a in st.acqs if a.epoch == st.top - 1]
            if st.top >= 2 and not st.found and displaced:
                return cls(key, st.top - 1, displaced[0].worker_id, st.max_seq + 1)
        return None

    def event(self) -> bytes:
        kind, effect = "effect_committed", "probe/after-restart"
        return _event(1, kind, self.key, self.epoch, self.worker, self.seq, effect_key=effect)


def takeover(name: str) -> list[bytes]:
    """A fresh workflow taken over, then a commit of its displaced owner: a finding opens."""
    wf = f"probe/{name}"
    return [
        _event(1, "lease_acquired", wf, 1, "worker-a", 1, source="coordinator"),
        _event(2, "lease_acquired", wf, 2, "worker-b", 2, source="coordinator"),
        _event(3, "effect_committed", wf, 1, "worker-a", 3, effect_key=f"{wf}/out"),
    ]


@dataclass(frozen=True, slots=True)
class Filled:
    states: int
    events: int
    seconds: float
    stale: Stale


def fill(
    broker: LocalKafka, topics: WorkerTopics, workflows: int, per_workflow: int, distinct: int
) -> Filled:
    """`workflows` states in the changelog, each as the worker's step left it, the first
    `distinct` written again under renamed keys up to `workflows` (see the module)."""
    producer = Producer(
        {
            **broker.client_config(),
            "transactional.id": f"{topics.group}-fill",
            # A transaction spans the processing of a chunk: minutes on a loaded machine.
            "transaction.timeout.ms": 600_000,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "compression.type": "lz4",
        }
    )
    producer.init_transactions(30)
    metrics = WorkerMetrics()
    started = time.perf_counter()
    written = events = in_txn = chunk = 0
    stale = None
    producer.begin_transaction()
    encoded: list[tuple[bytes, bytes]] = []  # the distinct states, for their copies
    while written < min(workflows, distinct):
        n = min(CHUNK, distinct - written)
        # Some of the n workflows get no event; the next chunk makes up for them.
        lines = tagged(history(n * per_workflow, n, seed=chunk), f"c{chunk}")
        processor = PartitionProcessor(0, Detector(), metrics)
        for offset, raw in enumerate(lines):
            processor.process(workflow_key(raw), raw, topics.input, offset, time.time())
        events += len(lines)
        states = processor.detector.states
        stale = stale or Stale.among(states)
        for key, state in list(states.items())[: min(workflows, distinct) - written]:
            encoded.append((key.encode(), encode_state(state)))
            written += 1
        chunk += 1
    copies = (encoded if c == 0 else copy(encoded, c) for c in range(-(-workflows // distinct)))
    for record_key, value in itertools.islice(itertools.chain.from_iterable(copies), workflows):
        produce(producer, topics.changelog, record_key, value)
        in_txn += 1
        if in_txn == TXN_RECORDS:
            producer.commit_transaction(60)
            producer.begin_transaction()
            in_txn = 0
    producer.commit_transaction(60)
    if stale is None:
        raise SystemExit("no workflow with a takeover in the history: fill more workflows")
    return Filled(workflows, events, time.perf_counter() - started, stale)


def copy(encoded: list[tuple[bytes, bytes]], n: int) -> Iterator[tuple[bytes, bytes]]:
    """The encoded states under keys of their own: `/export/` becomes `/export/k{n}-`."""
    renamed = f"/export/k{n}-".encode()
    return ((key.replace(b"/export/", renamed, 1), value) for key, value in encoded)


@dataclass(slots=True)
class Recovery:
    """Seconds from a worker's start to each thing seen (None: not seen)."""

    findings: dict[bytes, float | None]
    partitions: dict[bytes, int] = field(default_factory=dict)  # where each probe's finding was
    offsets_s: float | None = None  # the group's committed offsets reached the probes
    up_s: float | None = None  # the worker logged that it started (it fenced its predecessor)
    restored_s: float | None = None  # it logged the end of its restore
    restore_s: float | None = None  # the restore's duration, as logged
    restore_records: int | None = None  # the changelog records it read, as logged
    undecided_s: float | None = None  # its restore first logged an open transaction to wait for

    @property
    def processing_s(self) -> float | None:
        """When the first probe's finding was visible."""
        return min((s for s in self.findings.values() if s is not None), default=None)

    def processing_on(self, partitions: list[int]) -> float | None:
        """When the first probe's finding on one of `partitions` was visible."""
        return min(
            (
                s
                for key, s in self.findings.items()
                if s is not None and self.partitions.get(key) in partitions
            ),
            default=None,
        )


@dataclass(frozen=True, slots=True)
class Observer:
    """What watches a recovery: the findings topic and the group's committed offsets."""

    admin: AdminClient
    findings: TopicReader
    reader: Consumer  # of the group, never joining it: its committed offsets
    topics: WorkerTopics
    partitions: int

    def recover(
        self, start: Callable[[], WorkerProcess], probes: set[bytes]
    ) -> tuple[WorkerProcess, Recovery]:
        """Start a worker and `watch` it from its start."""
        started_wall, started = time.time(), time.monotonic()
        worker = start()
        return worker, self.watch(worker, started_wall, started, probes)

    def behind(self, target: dict[int, int]) -> bool:
        """Whether the group's committed offset of some input partition is short of `target`
        (or not known yet, while the group coordinator starts; a partition with no commit is at
        0)."""
        parts = [TopicPartition(self.topics.input, p) for p in target]
        try:
            done = self.reader.committed(parts, 10)
        except KafkaException:
            return True
        return any(max(tp.offset, 0) < target[tp.partition] for tp in done)  # none: -1001

    def watch(
        self,
        worker: WorkerProcess,
        started_wall: float,
        started: float,
        probes: set[bytes],
        timeout: float = 900.0,
    ) -> Recovery:
        """Seconds from `started` (monotonic; `started_wall` the same instant on the wall
        clock) until each probe's finding is visible and the group committed past the probes
        (or `timeout`)."""
        target = end_offsets(self.admin, self.topics.input, IsolationLevel.READ_UNCOMMITTED)
        seen = Recovery({key: None for key in probes})
        while None in seen.findings.values() or seen.offsets_s is None:
            if not worker.alive():
                raise SystemExit(f"the worker exited with {worker.exit_code()}:\n{worker.tail()}")
            if time.monotonic() - started > timeout:
                print(f"no finding of {sorted(probes)} within {timeout:.0f} s")
                break
            for record in self.findings.poll(0.1):
                if record.key in probes and seen.findings[record.key] is None:
                    seen.findings[record.key] = time.monotonic() - started
                    seen.partitions[record.key] = record.partition
            if seen.offsets_s is None and not self.behind(target):
                seen.offsets_s = time.monotonic() - started
        read_log(worker.log, started_wall, seen)
        return seen


def read_log(path: Path, started_wall: float, seen: Recovery) -> None:
    """The worker's start and the end of its restore, from its INFO lines since `started_wall`
    (the log is appended to by every start)."""
    for line in path.read_text(errors="replace").splitlines():
        try:
            at = datetime.datetime.strptime(line[:23], _LOG_TIME).timestamp() - started_wall
        except ValueError:
            continue
        if at < -0.01:  # an earlier start's; the log's clock has millisecond steps
            continue
        if seen.up_s is None and " started, group " in line:
            seen.up_s = at
        if seen.undecided_s is None and " is undecided, waiting for it" in line:
            seen.undecided_s = at
        match = _RESTORED.search(line)
        if match is not None and seen.restored_s is None:
            seen.restored_s, seen.restore_s = at, float(match.group(2))
            seen.restore_records = int(match.group(3))


def owned(worker: WorkerProcess) -> list[int]:
    """The partitions of the worker's latest restore, from its log: the ones it owns."""
    restores = owned_log(worker)
    return [int(p) for p in restores[-1][0].split(", ") if p] if restores else []


def restore_metric(worker: WorkerProcess) -> tuple[int, float, int]:
    """Restores, their total seconds and the changelog records they read, from the worker's
    `splitbrain_state_restore_seconds` and `splitbrain_state_restore_records_total`."""
    count = sum(worker.samples("splitbrain_state_restore_seconds_count", "").values())
    total = sum(worker.samples("splitbrain_state_restore_seconds_sum", "").values())
    records = sum(worker.samples("splitbrain_state_restore_records_total", "").values())
    return int(count), total, int(records)


def fmt(seconds: float | None) -> str:
    return "not seen" if seconds is None else f"{seconds:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workflows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--store", choices=["memory", "rocksdb"], default="memory")
    ap.add_argument("--events-per-workflow", type=int, default=4)
    ap.add_argument("--distinct", type=int, help="workflows through the step; default: all")
    ap.add_argument(
        "--standby",
        action="store_true",
        help="two workers with --standby all; SIGKILL the owner of partition 0, time the other",
    )
    ap.add_argument(
        "--feed", type=float, default=0.0, help="with --standby: events/s through the failover"
    )
    ap.add_argument(
        "--held-transaction",
        action="store_true",
        help="with --standby: SIGKILL the owner inside a commit, its transaction left open",
    )
    ap.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker setting over the defaults (repeatable)",
    )
    args = ap.parse_args()
    if (args.feed or args.held_transaction) and not args.standby:
        ap.error("--feed and --held-transaction need --standby")
    if not all("=" in item for item in args.broker_config):
        ap.error("--broker-config takes KEY=VALUE")
    tuned = dict(item.split("=", 1) for item in args.broker_config)
    with broker_with_topics("rec", args.partitions, tuned) as (broker, topics):
        run(args, broker, topics)


def run(args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics) -> None:
    print(machine())
    if broker.broker_config:
        print(f"broker settings over the defaults: {broker.broker_config}")
    config = broker.client_config()
    admin = AdminClient(config)
    compact = CHANGELOG_CONFIG  # as the worker creates it
    create_topics(config, [NewTopic(topics.changelog, args.partitions, 1, config=compact)])
    distinct = args.distinct or args.workflows
    filled = fill(broker, topics, args.workflows, args.events_per_workflow, distinct)
    offsets = sum(end_offsets(admin, topics.changelog, IsolationLevel.READ_UNCOMMITTED).values())
    print(
        f"changelog filled directly (no worker): {filled.states:,} workflow states from "
        f"{filled.events:,} events of bench_engine's history through the worker's processing "
        f"step ({distinct:,} distinct states, the rest copies under renamed keys), "
        f"encode_state'd, {TXN_RECORDS:,} per transaction, lz4, in {filled.seconds:.0f} s; "
        f"{offsets:,} offsets, {topic_bytes(broker, topics.changelog) / 1e6:,.0f} MB on disk; "
        "one record per workflow, as after compaction"
    )
    print(f"store {args.store}, {args.partitions} partition(s), worker defaults otherwise")
    observer = Observer(
        admin,
        TopicReader(config, topics.findings),
        Consumer({**config, "group.id": topics.group}),
        topics,
        args.partitions,
    )
    workers: list[WorkerProcess] = []

    def start(instance: str) -> WorkerProcess:
        standby = ("--standby", "all") if args.standby else ()
        module = "detector.testing.stalling_worker" if args.held_transaction else "detector.cli"
        worker = start_worker(
            broker,
            topics,
            "--store",
            args.store,
            "--log-level",
            "INFO",
            *standby,
            metrics_port=free_port(),
            instance=instance,
            module=module,
        )
        workers.append(worker)
        return worker

    try:
        publish(broker.bootstrap, topics.input, takeover("first-start"))
        worker, first = observer.recover(lambda: start("bench"), {b"probe/first-start"})
        print(
            f"first start: processing {fmt(first.processing_s)} after the start "
            f"(restore {fmt(first.restore_s)}, logged)"
        )
        if args.standby:
            failover(observer, worker, start, broker, filled, offsets, args)
        else:
            restart(observer, worker, broker, filled, offsets)
    finally:
        for worker in workers:
            worker.stop()
        observer.findings.close()
        observer.reader.close()


def kill_and_probe(worker: WorkerProcess, broker: LocalKafka, filled: Filled) -> float:
    """SIGKILL `worker` and publish the probes; the seconds that took."""
    killed = time.monotonic()
    worker.kill()
    publish(
        broker.bootstrap, worker.topics.input, [*takeover("after-restart"), filled.stale.event()]
    )
    return time.monotonic() - killed


def probes_of(filled: Filled) -> set[bytes]:
    return {b"probe/after-restart", filled.stale.key.encode()}


def restart(
    observer: Observer, worker: WorkerProcess, broker: LocalKafka, filled: Filled, offsets: int
) -> None:
    """The worker killed and started again: it restores the whole changelog."""
    gap = kill_and_probe(worker, broker, filled)
    _, again = observer.recover(worker.start, probes_of(filled))
    report(worker, again, filled, offsets, gap)


def failover(
    observer: Observer,
    first: WorkerProcess,
    start: Callable[[str], WorkerProcess],
    broker: LocalKafka,
    filled: Filled,
    offsets: int,
    args: argparse.Namespace,
) -> None:
    """A second worker joins; once the one that does not own partition 0 has its standby caught
    up, the owner is killed for good and the other takes over (busy at `args.feed` events/s;
    the owner killed with its transaction open: `args.held_transaction`)."""
    feed = args.feed
    joined = time.monotonic()
    second = start("bench-standby")
    until(
        lambda: bool(owned_log(second)) and len(owned_log(first)) >= 2,
        "the second worker in the group",
        [first, second],
    )
    owner, survivor = (first, second) if 0 in owned(first) else (second, first)
    until(
        lambda: survivor.samples("splitbrain_standby_lag_records", "partition").get("0") == 0,
        "the survivor's standby of partition 0 to catch up",
        [first, second],
    )
    print(
        f"second worker started, --standby all on both: {owner.instance} owns {owned(owner)}, "
        f"{survivor.instance} {owned(survivor)}; the survivor's standby of partition 0 caught "
        f"up {time.monotonic() - joined:.1f} s after the second start (metric sampled every 5 s)"
    )
    with feeding(broker.bootstrap, owner.topics.input, feed):
        if feed:
            time.sleep(20)  # both workers busy before the SIGKILL
            print(f"publishing ~{feed:,.0f} events/s from 20 s before the SIGKILL")
        before = restore_metric(survivor)
        assert owner.proc is not None
        owner_rss = vm_kb(owner.proc.pid, "VmRSS")
        taken = owned(owner)
        if args.held_transaction:
            hold_a_transaction(owner, broker, taken[0])
        started_wall, started = time.time(), time.monotonic()
        gap = kill_and_probe(owner, broker, filled)
        seen = observer.watch(survivor, started_wall, started, probes_of(filled))
    processing = seen.processing_on(taken)
    print(f"SIGKILL of the owner of partitions {taken}, probes published {gap:.2f} s after:")
    print(
        f"  SIGKILL -> processing again by the survivor (the first finding of a probe on those "
        f"partitions visible read_committed): {fmt(processing)}  [target <= {TARGET_S:.0f} s "
        "at 10^6 workflows]"
    )
    probe_findings(seen, filled)
    print(f"    the probes' findings by partition: {seen.partitions}")
    if seen.restored_s is not None and seen.restore_s is not None:
        after = None if processing is None else processing - seen.restored_s
        print(
            f"    phases (survivor's log): the killed member's session and the rebalance "
            f"{seen.restored_s - seen.restore_s:.2f} s; restore {seen.restore_s:.2f} s "
            f"({seen.restore_records} changelog records) [target <= {STANDBY_TARGET_S:.0f} s]; "
            f"first batch committed and read {fmt(after)}"
        )
    if seen.undecided_s is not None:
        print(
            f"    the restore waited for an undecided transaction (first logged "
            f"{seen.undecided_s:.2f} s after the SIGKILL)"
        )
    count, total, records = (a - b for a, b in zip(restore_metric(survivor), before, strict=True))
    print(
        f"  the takeover's restore: splitbrain_state_restore_seconds +{count} restore(s), "
        f"{total:.2f} s; splitbrain_state_restore_records_total +{records:,} records, of the "
        f"changelog's {offsets:,} offsets"
    )
    memory(survivor, filled, "survivor (its own and the warm state)")
    if owner_rss is not None:
        print(f"  killed owner's RSS before the kill: {owner_rss / 1024:,.0f} MB")


def hold_a_transaction(owner: WorkerProcess, broker: LocalKafka, partition: int) -> None:
    """Arm the owner's stall in its next commit (SIGUSR2) and give it an event to commit on
    `partition`; return once it holds its states in a transaction it has not committed.

    First a random wait of up to 10 s: the coordinator looks for timed-out transactions every
    `transaction.abort.timed.out.transaction.cleanup.interval.ms` (10 s) from its start, and
    the bench's timeline from the broker's start is nearly the same each run, so that without
    it every run would meet that scan at the same phase."""
    time.sleep(random.uniform(0.0, 10.0))
    owner.signal(signal.SIGUSR2)
    wf = "probe/held"
    raw = _event(1, "lease_acquired", wf, 1, "worker-a", 1, source="coordinator")
    producer = Producer(broker.client_config())
    producer.produce(owner.topics.input, key=wf.encode(), value=raw, partition=partition)
    producer.flush(30)
    until(
        lambda: COMMIT_MARK in owner.log.read_text(errors="replace"),
        "the owner's transaction to hold its states",
        [owner],
    )
    print(f"the owner holds a transaction open on partition {partition}: its states, uncommitted")


@contextlib.contextmanager
def feeding(bootstrap: str, topic: str, rate: float) -> Iterator[None]:
    """bench_engine's history published at about `rate` events/s from a thread while inside
    (nothing at 0), five minutes' worth at most."""
    stop = threading.Event()

    def feed() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        events = int(rate * 300)
        for raw in tagged(history(events, max(1, events // 10), seed=99), "feed"):
            if stop.wait(1 / rate):
                break
            produce(producer, topic, workflow_key(raw), raw)
        producer.flush(30)

    thread = threading.Thread(target=feed, daemon=True)
    if rate:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if rate:
            thread.join()


def owned_log(worker: WorkerProcess) -> list[str]:
    """The worker's logged restores."""
    return _RESTORED.findall(worker.log.read_text(errors="replace"))


def until(condition: Callable[[], bool], what: str, workers: list[WorkerProcess]) -> None:
    """Wait (up to 15 minutes) for `condition`; stop if a worker exits."""
    deadline = time.monotonic() + 900
    while not condition():
        for worker in workers:
            if not worker.alive():
                raise SystemExit(f"{worker.instance} exited waiting for {what}:\n{worker.tail()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within 900 s")
        time.sleep(0.5)


def probe_findings(seen: Recovery, filled: Filled) -> None:
    fresh = seen.findings[b"probe/after-restart"]
    restored = seen.findings[filled.stale.key.encode()]
    print(
        f"    fresh workflow's finding {fmt(fresh)}, restored workflow's finding "
        f"{fmt(restored)}, group offsets past the probes {fmt(seen.offsets_s)}"
    )


def memory(worker: WorkerProcess, filled: Filled, what: str) -> None:
    assert worker.proc is not None
    rss, peak = vm_kb(worker.proc.pid, "VmRSS"), vm_kb(worker.proc.pid, "VmHWM")
    if rss is not None and peak is not None:
        print(
            f"  {what} RSS after the restore: {rss / 1024:,.0f} MB (peak {peak / 1024:,.0f} "
            f"MB), {rss * 1024 / filled.states:,.0f} bytes per workflow (the baseline included)"
        )


def report(worker: WorkerProcess, seen: Recovery, filled: Filled, offsets: int, gap: float) -> None:
    print(f"SIGKILL, probes published, restart {gap:.2f} s after the SIGKILL:")
    print(
        f"  restart -> processing again (the first probe finding visible read_committed): "
        f"{fmt(seen.processing_s)}  [target <= {TARGET_S:.0f} s at 10^6 workflows]"
    )
    probe_findings(seen, filled)
    if seen.up_s is not None and seen.restored_s is not None and seen.restore_s is not None:
        joined = seen.restored_s - seen.restore_s
        after = None if seen.processing_s is None else seen.processing_s - seen.restored_s
        print(
            f"    phases (worker log): up and fenced its predecessor {seen.up_s:.2f} s; "
            f"group join (the killed member's session expiring) {joined - seen.up_s:.2f} s; "
            f"restore {seen.restore_s:.2f} s; first batch "
            f"committed and read {fmt(after)}"
        )
    count, total, _ = restore_metric(worker)
    restore_s = total if count else seen.restore_s
    rate = f"{offsets / restore_s:,.0f}" if restore_s else "?"
    print(
        f"  restore: splitbrain_state_restore_seconds {count} restore(s), {total:.2f} s; "
        f"{offsets:,} changelog offsets ({filled.states:,} states) -> {rate} records/s"
    )
    memory(worker, filled, "worker")


if __name__ == "__main__":
    main()
