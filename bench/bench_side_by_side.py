"""The worker's cost per event, side by side with what it is built on and what it competes with.

One broker, one history published once; then each row reads that same input topic, one after
another, each from a fresh consumer group and with the previous row's processes stopped:

1. a plain confluent-kafka consumer (read_committed, `consume(1000)`) to the end of the topic;
2. the same, validating every record with the worker's parse function (`parse_event_json`);
3. `splitbrain worker`: kafka runtime, exactly-once, memory store;
4. the same with `--processing-guarantee at-least-once` (when `worker --help` lists the flag);
5. bench/quix_detector.py: the same job as a quixstreams exactly-once application, with its
   own RocksDB state; its final finding revisions are compared with row 3's;
6. `splitbrain worker --runtime faust`;
7. the state changelog's bytes per input byte of row 3;
8. event -> finding visible to a read_committed consumer, on fresh topics, under a background
   load at half of row 3's rate (bench_latency.py's probes).

Rows 3-6 are rated as bench_worker.py rates a worker: from their group's committed offsets,
sampled, between the first commit and the last sample before the end; and per third of the
history (`fleet_history.Thirds`: does the rate hold as the state grows?). Every row that commits
commits as often as the worker by default (`--commit-interval-ms`, `--commit-max-events`).

The history (`--shape`): `engine`, bench_engine.py's mix (`--events` over `--workflows`, 20,000
by default), or a fleet shape of bench_fleet_worker.py, `short` or `long` (fleet_history.py;
`--workflows`, `--live`). Row 6 runs on the first `--faust-events` events only (all by default),
published on a topic of their own: the faust runtime is some fifty times slower on a fleet. Row
8's load is bench_engine.py's mix whatever the shape: its probes are what it times.

quixstreams pins confluent-kafka and pydantic below this project's pins, so it cannot share the
project's venv (nor be a `bench` extra): the quixstreams row runs in var/bench-quix-venv, built
on first use from bench/requirements-quix.txt (PyPI), with this checkout on its path. Its
pydantic is one minor release older: its parse cost is that version's.

Prints a table and a JSON document (`--json PATH` writes it too); asserts nothing.
Run: `python bench/bench_side_by_side.py [--events N] [--workflows N] [--partitions N]` or
`make bench-side-by-side`; a steady-state fleet of 120,000 workflows, 4,000 live at once:
`--shape short --workflows 120000 --live 4000 --partitions 6 --faust-events 10000`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from bench_engine import history
from bench_latency import PacedLoad, Prober, latencies, percentiles
from bench_worker import Throughput, publish, throughput, topic_bytes
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from fleet_history import FLAT, SHAPES, ZOMBIE_EVERY, Thirds, fleet
from stack import broker_with_topics, machine, outputs_on, start_worker

from detector import gc_tuning
from detector.contracts.events import parse_event_json
from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from detector.devstack.topics import WorkerTopics, end_offsets, group_offsets, read_committed
from detector.devstack.worker import WorkerProcess

ROOT: Final = Path(__file__).resolve().parent.parent
QUIX_APP: Final = ROOT / "bench" / "quix_detector.py"
QUIX_REQUIREMENTS: Final = ROOT / "bench" / "requirements-quix.txt"
QUIX_VENV: Final = ROOT / "var" / "bench-quix-venv"
# The project's own pins the quixstreams venv takes: what detector.core needs beside pydantic,
# and the RocksDB binding quixstreams' state runs on, at the version the worker's rocksdb store has.
FROM_PROJECT: Final = ("msgspec", "rocksdict")
LATENCY_SLACK_MS: Final = 150.0  # the target: commit interval + this
BATCH: Final = 1000  # rows 1 and 2: `consume(1000)`
ENGINE_WORKFLOWS: Final = 20_000  # --shape engine's, by default


class UnavailableError(Exception):
    """A row that cannot run here; its reason is printed in its place."""


@dataclass(slots=True)
class Row:
    number: int
    name: str
    unit: str = "events/s"
    value: float | None = None
    note: str = ""
    unavailable: str | None = None
    thirds: list[float] | None = None  # rows 3-6: the rate in each third of the history

    def cell(self) -> str:
        if self.unavailable is not None:
            return f"not available: {self.unavailable}"
        if self.value is None or math.isnan(self.value):
            return "n/a"
        if self.unit == "events/s":
            return f"{self.value:,.0f} events/s"
        if self.unit == "ms":
            return f"p99 {self.value:,.0f} ms"
        return f"{self.value:.3f}"


@dataclass(slots=True)
class Ratio:
    name: str
    value: float | None
    target: str  # the bound as printed; "reported" when there is none
    met: bool | None = field(default=None)


# ---- rows 1 and 2: a plain consumer --------------------------------------------------------------


def consume_rate(broker: LocalKafka, topic: str, partitions: int, validate: bool) -> float:
    """Records/s of a read_committed consumer reading `topic` to its end, optionally parsing
    each value: over its full batches after the first. The first pays for the connection and
    the first fetch; a partial batch (the last) returns only when `consume` times out."""
    consumer = Consumer(
        {
            **broker.client_config(),
            "group.id": f"consume-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    pending = set(range(partitions))
    count = 0
    full: list[tuple[float, int]] = []  # (time, records read) after each full batch
    deadline = time.monotonic() + 600
    try:
        while pending:
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic} was not read to its end in 10 minutes")
            batch = consumer.consume(BATCH, timeout=0.1)
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    pending.discard(msg.partition())
                    continue
                if validate:
                    parse_event_json(msg.value() or b"")
                count += 1
            if len(batch) == BATCH:
                full.append((time.perf_counter(), count))
    finally:
        consumer.close()
    if len(full) < 2:
        return math.nan
    (t0, n0), (t1, n1) = full[0], full[-1]
    return (n1 - n0) / (t1 - t0)


# ---- rows 3, 4 and 6: splitbrain worker ----------------------------------------------------------


def commit_flags(args: argparse.Namespace) -> tuple[str, ...]:
    return (
        *("--commit-interval-ms", str(args.commit_interval_ms)),
        *("--commit-max-events", str(args.commit_max_events)),
    )


def lacks_flag(flag: str) -> str | None:
    """Why `splitbrain worker` cannot be given `flag` (its --help does not list it), or None."""
    shown = subprocess.run(
        [sys.executable, "-m", "detector.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return None if flag in shown.stdout else f"`splitbrain worker --help` lists no {flag}"


def rated(row: Row, done: Throughput, waited_s: float | None = None) -> Row:
    """`waited_s`: the worker's time in commits (its commit histogram's sum), if it has one."""
    row.value = done.rate
    thirds = Thirds.of(done)
    a, b, c = thirds.rates
    row.thirds = [a, b, c]
    row.note = (
        f"per third {a:,.0f} | {b:,.0f} | {c:,.0f} (last/first {thirds.flat:.2f}); "
        f"first commit after {done.first_commit_s:.1f} s, all in {done.finished_s:.1f} s"
    )
    if waited_s is not None:
        share = waited_s / (done.finished_s - done.first_commit_s)
        row.note += f"; {waited_s:.1f} s ({share:.0%} of the run) waiting for commits"
    return row


def commit_wait_s(worker: WorkerProcess) -> float | None:
    """What the worker spent waiting for the broker in commits (flushes, offsets, the commit
    itself; `splitbrain_transaction_commit_seconds`), None without its /metrics."""
    if worker.metrics_port is None:
        return None
    return sum(worker.samples("splitbrain_transaction_commit_seconds_sum", "").values())


# ---- row 5: the quixstreams application ----------------------------------------------------------


def project_pins(names: tuple[str, ...]) -> list[str]:
    """This project's requirements (runtime and extras) of the packages `names`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    every = [
        *project["dependencies"],
        *(r for rs in project["optional-dependencies"].values() for r in rs),
    ]
    return [r for r in every if re.split(r"[\s\[=<>!~;]", r, maxsplit=1)[0] in names]


def quix_python() -> Path:
    """The python of the quixstreams venv, built on first use and again when what it should
    hold changes (the requirements it was built with are kept in it, to compare)."""
    wanted = "\n".join([QUIX_REQUIREMENTS.read_text().rstrip(), *project_pins(FROM_PROJECT), ""])
    python = QUIX_VENV / "bin" / "python"
    held = QUIX_VENV / "requirements.txt"
    if python.exists() and held.exists() and held.read_text() == wanted:
        return python
    print(f"building {QUIX_VENV.relative_to(ROOT)} (once) ...", flush=True)
    shutil.rmtree(QUIX_VENV, ignore_errors=True)
    pending = QUIX_VENV / "requirements.pending"
    try:
        _run(sys.executable, "-m", "venv", str(QUIX_VENV))
        pending.write_text(wanted)
        _run(str(python), "-m", "pip", "install", "-q", "-r", str(pending))
        site = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or "").strip().splitlines() or [str(exc)]
        raise UnavailableError(f"could not build {QUIX_VENV.name}: {lines[-1]}") from None
    # this checkout, as it is now, on the venv's path: the same engine as the worker's
    Path(site, "splitbrain-checkout.pth").write_text(f"{ROOT}\n")
    pending.rename(held)
    return python


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def quix_version() -> str:
    found = re.search(r"^quixstreams==(\S+)", QUIX_REQUIREMENTS.read_text(), re.MULTILINE)
    return found.group(1) if found else "?"


@dataclass
class QuixProcess(WorkerProcess):
    """bench/quix_detector.py in its venv: started, logged and stopped as a worker is."""

    python: Path = Path(sys.executable)

    def argv(self) -> list[str]:
        t = self.topics
        return [
            *(str(self.python), str(QUIX_APP)),
            *("--bootstrap-servers", str(self.config["bootstrap.servers"])),
            *("--input-topic", t.input, "--findings-topic", t.findings, "--group-id", t.group),
            *("--state-dir", str(self.state_dir)),
            *self.extra,
        ]


def final_revisions(broker: LocalKafka, topic: str) -> dict[str, dict[str, Any]]:
    """The last revision of each finding on `topic`, as a read_committed reader keeps them."""
    latest: dict[str, dict[str, Any]] = {}
    for record in read_committed(broker.client_config(), topic, timeout=300):
        doc = json.loads(record.value)
        kept = latest.get(doc["finding_id"])
        if kept is None or doc["revision"] > kept["revision"]:
            latest[doc["finding_id"]] = doc
    return latest


def compare_findings(
    ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    only_ours = sorted(ours.keys() - theirs.keys())
    only_theirs = sorted(theirs.keys() - ours.keys())
    different = sorted(k for k in ours.keys() & theirs.keys() if ours[k] != theirs[k])
    return {
        "worker_findings": len(ours),
        "quix_findings": len(theirs),
        "identical": not (only_ours or only_theirs or different),
        "only_worker": len(only_ours),
        "only_quix": len(only_theirs),
        "different": len(different),
        "examples": (only_ours + only_theirs + different)[:5],
    }


# ---- the run -------------------------------------------------------------------------------------


@dataclass
class SideBySide:
    """The rows, measured one after another against one published history."""

    args: argparse.Namespace
    broker: LocalKafka
    input_topic: str
    total: int  # records on the input topic
    input_bytes: int
    workflows: int  # row 8's load spreads over as many
    faust_input: tuple[str, int]  # row 6's topic and its records: the history or its start
    rows: dict[int, Row] = field(default_factory=dict)
    eos_topics: WorkerTopics | None = None  # row 3's: its changelog and its findings
    waits: dict[str, float | None] = field(default_factory=dict)  # by instance: `commit_wait_s`
    findings: dict[str, Any] | None = None  # row 5's findings against row 3's
    latency: dict[str, Any] | None = None  # row 8's numbers

    def show(self, row: Row, measure: Callable[[Row], None] | None = None) -> None:
        """Measure `row` (an unavailable one says why), keep it and print it at once."""
        if measure is not None:
            try:
                measure(row)
            except UnavailableError as exc:
                row.unavailable = str(exc)
        self.rows[row.number] = row
        print(f"  row {row.number} {row.name}: {row.cell()}  {row.note}".rstrip(), flush=True)

    def all_rows(self) -> None:
        for number, validate in ((1, False), (2, True)):
            name = "consume + validate (parse_event_json)" if validate else "consume"
            rate = consume_rate(self.broker, self.input_topic, self.args.partitions, validate)
            self.show(Row(number, f"confluent-kafka {name}, read_committed", value=rate))
        self.show(Row(3, "splitbrain worker, exactly-once, memory store"), self.eos)
        changelog = Row(7, "changelog bytes per input byte (row 3)", unit="ratio")
        self.changelog(changelog)  # now: row 3's changelog as it wrote it
        self.show(Row(4, "splitbrain worker, at-least-once, memory store"), self.at_least_once)
        self.show(Row(5, f"quixstreams {quix_version()} app, exactly-once, RocksDB"), self.quix)
        self.show(Row(6, "splitbrain worker --runtime faust, memory store"), self.faust)
        self.show(changelog)
        name = "event -> finding visible (read_committed), at 50% of row 3's rate"
        self.show(Row(8, name, unit="ms"), self.visible)

    def worker(
        self, name: str, *flags: str, runtime: str = "kafka", on: tuple[str, int] | None = None
    ) -> tuple[Throughput, WorkerTopics]:
        """A worker from a fresh group on the history (or `on`: a topic and its records),
        rated, then stopped."""
        topic, total = on or (self.input_topic, self.total)
        topics = outputs_on(self.broker, topic, f"sbs-{name}", self.args.partitions)
        worker = start_worker(
            self.broker,
            topics,
            *commit_flags(self.args),
            *flags,
            runtime=runtime,
            instance=name,
            metrics_port=free_port(),
        )
        return self.rate(worker, total), topics

    def rate(self, process: WorkerProcess, total: int | None = None) -> Throughput:
        """Rate `process` (just started) as bench_worker.py does, to `total` records (the
        history's by default); stop it whatever happens."""
        try:
            done = throughput(
                self.broker,
                process,
                process.topics,
                self.args.partitions,
                total or self.total,
                self.args.sample_interval_s,
            )
            self.waits[process.instance] = commit_wait_s(process)
            return done
        except SystemExit as exc:  # it died, or did not finish
            raise UnavailableError(f"it failed: {str(exc).splitlines()[0]}") from None
        finally:
            process.stop()

    def eos(self, row: Row) -> None:
        done, self.eos_topics = self.worker("eos")
        rated(row, done, self.waits.get("eos"))

    def changelog(self, row: Row) -> None:
        if self.eos_topics is None:
            row.unavailable = "row 3 did not run"
            return
        written = topic_bytes(self.broker, self.eos_topics.changelog)
        row.value = written / self.input_bytes
        row.note = (
            f"changelog {written / 1e6:,.1f} MB / input {self.input_bytes / 1e6:,.1f} MB, "
            "before compaction"
        )

    def at_least_once(self, row: Row) -> None:
        missing = lacks_flag("--processing-guarantee")
        if missing is not None:
            raise UnavailableError(missing)
        done = self.worker("alo", "--processing-guarantee", "at-least-once")[0]
        rated(row, done, self.waits.get("alo"))

    def faust(self, row: Row) -> None:
        rated(row, self.worker("faust", runtime="faust", on=self.faust_input)[0])
        if self.faust_input[1] < self.total:
            row.note += f"; on the first {self.faust_input[1]:,} events"

    def quix(self, row: Row) -> None:
        python = quix_python()
        topics = outputs_on(self.broker, self.input_topic, "sbs-quix", self.args.partitions)
        app = QuixProcess(
            self.broker.client_config(),
            topics,
            self.broker.data_dir.parent / "workers",
            instance="quix",
            extra=commit_flags(self.args),
            python=python,
        ).start()
        rated(row, self.rate(app))
        if self.eos_topics is None:
            row.note += "; findings not compared: row 3 did not run"
            return
        found = self.findings = compare_findings(
            final_revisions(self.broker, self.eos_topics.findings),
            final_revisions(self.broker, topics.findings),
        )
        if found["identical"]:
            row.note += f"; findings identical to row 3's ({found['worker_findings']:,})"
            return
        row.note += "; FINDINGS DIFFER FROM ROW 3's"
        loud = (
            f"MISMATCH: the quixstreams app's findings differ from the worker's: "
            f"{found['only_worker']} only in the worker's, {found['only_quix']} only in the "
            f"app's, {found['different']} with another final revision; e.g. {found['examples']}"
        )
        print(f"!!! {loud}", flush=True)
        print(f"!!! {loud}", file=sys.stderr, flush=True)

    def visible(self, row: Row) -> None:
        """bench_latency.py's probes, on fresh topics, under half of row 3's rate."""
        eos = self.rows[3].value
        if eos is None or math.isnan(eos):
            raise UnavailableError("row 3 has no rate")
        load_rate = eos / 2
        config, partitions = self.broker.client_config(), self.args.partitions
        fresh = WorkerTopics.fresh("sbs-lat").create(config, partitions)
        load = history(max(1, int(load_rate * self.args.latency_seconds)), self.workflows)
        paced = PacedLoad(self.broker.bootstrap, fresh.input, load, load_rate)
        worker = start_worker(self.broker, fresh, *commit_flags(self.args), instance="latency")
        prober = Prober(self.broker.bootstrap, fresh, partitions)
        try:
            taken = latencies(prober, self.args.latency_samples, paced)
            behind = backlog(config, fresh)
        except SystemExit as exc:
            raise UnavailableError(str(exc)) from None
        finally:
            prober.close()
            worker.stop()
        if len(taken) < 2:
            raise UnavailableError(f"{len(taken)} sample(s) within the load")
        q = percentiles(taken)
        self.latency = {
            **{f"{k}_ms": v for k, v in q.items()},
            "samples": len(taken),
            "load_events_per_s": load_rate,
            "backlog_at_end": behind,
        }
        row.value = q["p99"]
        row.note = (
            f"p50 {q['p50']:,.0f} ms, p95 {q['p95']:,.0f} ms, max {q['max']:,.0f} ms; "
            f"{len(taken)} samples under {load_rate:,.0f} events/s; "
            f"{behind:,} input records not committed when the load ended"
        )


def backlog(config: dict[str, Any], topics: WorkerTopics) -> int:
    """Input records the group has not committed yet: whether the worker kept up."""
    admin = AdminClient(config)
    ends = end_offsets(admin, topics.input, IsolationLevel.READ_UNCOMMITTED)
    done = group_offsets(admin, topics.group, topics.input)
    return sum(end - max(done.get(p, 0), 0) for p, end in ends.items())


def histories(args: argparse.Namespace) -> tuple[list[bytes], int, str]:
    """The history of `--shape`, its workflows, and what the printout calls it."""
    if args.shape == "engine":
        workflows = args.workflows or ENGINE_WORKFLOWS
        return history(args.events, workflows), workflows, "bench_engine's mix"
    shape = SHAPES[args.shape]
    workflows = args.workflows or shape.workflows
    live = args.live or shape.live
    lines = fleet(workflows, shape.per_workflow, ZOMBIE_EVERY, live=live, life=shape.life)
    at_once = "a fifth of the history each" if live is None else f"~{live:,} live at once"
    return lines, workflows, f"fleet, {args.shape} ({shape.name}; {at_once})"


def faust_topic(
    args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics, lines: list[bytes]
) -> tuple[str, int]:
    """Row 6's input: the history's first `--faust-events` on a topic of their own, or the
    history itself."""
    prefix = lines[: args.faust_events]
    if len(prefix) == len(lines):
        return topics.input, len(lines)
    own = WorkerTopics.fresh("sbs-prefix").create(broker.client_config(), args.partitions)
    publish(broker.bootstrap, own.input, prefix)
    return own.input, len(prefix)


def run(args: argparse.Namespace, broker: LocalKafka, topics: WorkerTopics) -> dict[str, Any]:
    lines, workflows, shape = histories(args)
    total = len(lines)
    started = time.perf_counter()
    publish(broker.bootstrap, topics.input, lines)
    publish_s = time.perf_counter() - started
    faust_input = faust_topic(args, broker, topics, lines)
    del lines
    input_bytes = topic_bytes(broker, topics.input)
    load_at_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    print(machine() + f"; load average {load_at_start:.2f} at the start")
    print(
        f"history ({shape}): {total:,} events over {workflows:,} workflows, {args.partitions} "
        f"partition(s), {input_bytes / 1e6:,.1f} MB on the broker, published once in "
        f"{publish_s:.1f} s; commits every {args.commit_interval_ms} ms or "
        f"{args.commit_max_events} records",
        flush=True,
    )
    bench = SideBySide(args, broker, topics.input, total, input_bytes, workflows, faust_input)
    bench.all_rows()
    ratios = judged(bench.rows, args.commit_interval_ms + LATENCY_SLACK_MS)
    return {
        "machine": {
            "arch": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "broker": "on the same machine",
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg()[0],
        },
        "logs": str(broker.data_dir.parent / "workers"),
        "history": {
            "shape": shape,
            "events": total,
            "workflows": workflows,
            "partitions": args.partitions,
            "input_bytes": input_bytes,
            "publish_s": publish_s,
        },
        "commit": {"interval_ms": args.commit_interval_ms, "max_events": args.commit_max_events},
        "rows": [asdict(bench.rows[n]) for n in sorted(bench.rows)],
        "findings_check": bench.findings,
        "latency": bench.latency,
        "ratios": [asdict(r) for r in ratios],
    }


def judged(rows: dict[int, Row], latency_target_ms: float) -> list[Ratio]:
    """The ratios and bounds the issue sets, from the rows that have a value."""

    def value(n: int) -> float | None:
        row = rows.get(n)
        if row is None or row.unavailable is not None or row.value is None:
            return None
        return None if math.isnan(row.value) else row.value

    def per(a: int, b: int) -> float | None:
        x, y = value(a), value(b)
        return None if x is None or not y else x / y

    def flat(n: int) -> float | None:
        thirds = rows[n].thirds if value(n) is not None else None
        ratio = thirds[2] / thirds[0] if thirds and thirds[0] else math.nan
        return None if math.isnan(ratio) else ratio

    def bound(name: str, v: float | None, at_least: bool, limit: float, shown: str) -> Ratio:
        met = None if v is None else (v >= limit if at_least else v <= limit)
        return Ratio(name, v, shown, met)

    return [
        bound("worker / (consume + validate)", per(3, 2), True, 0.5, ">= 0.5"),
        bound("worker, last third / first third", flat(3), True, FLAT, f">= {FLAT}"),
        bound("worker / at-least-once worker", per(3, 4), True, 0.9, ">= 0.9"),
        bound("worker / quixstreams", per(3, 5), True, 2.0, ">= 2"),
        Ratio("worker / faust", per(3, 6), "reported"),
        bound("changelog bytes per input byte", value(7), False, 0.2, "<= 0.2"),
        bound(
            "p99 event -> visible finding (ms)",
            value(8),
            False,
            latency_target_ms,
            f"<= {latency_target_ms:.0f} ms (commit interval + {LATENCY_SLACK_MS:.0f} ms)",
        ),
    ]


def print_table(doc: dict[str, Any]) -> None:
    rows = doc["rows"]
    width = max(len(r["name"]) for r in rows) + 6
    print()
    print(f"{'row':<{width}} {'result':>22}  note")
    for r in rows:
        row = Row(**r)
        print(f"{f'{row.number}. {row.name}':<{width}} {row.cell():>22}  {row.note}".rstrip())
    print()
    print(f"{'ratio':<40} {'value':>10}  {'target':<45} verdict")
    for r in doc["ratios"]:
        v = "n/a" if r["value"] is None else f"{r['value']:,.2f}"
        verdict = {True: "met", False: "NOT MET", None: ""}[r["met"]]
        print(f"{r['name']:<40} {v:>10}  {r['target']:<45} {verdict}".rstrip())
    print()


def nan_free(value: Any) -> Any:
    """JSON has no NaN: a rate that could not be measured is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_free(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_free(v) for v in value]
    return value


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", choices=["engine", *SHAPES], default="engine")
    ap.add_argument("--events", type=int, default=300_000, help="--shape engine's")
    ap.add_argument(
        "--workflows",
        type=int,
        help=f"default: engine {ENGINE_WORKFLOWS:,}, "
        + ", ".join(f"{k} {v.workflows:,}" for k, v in SHAPES.items()),
    )
    ap.add_argument("--live", type=int, help="a fleet shape's workflows live at once")
    ap.add_argument("--faust-events", type=int, help="row 6 runs on as many (default: all)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--commit-interval-ms", type=int, default=100, help="the worker's default")
    ap.add_argument("--commit-max-events", type=int, default=5000, help="the worker's default")
    ap.add_argument(
        "--sample-interval-s",
        type=float,
        default=0.5,
        help="how often the committed offsets are read (bench_worker.py: 0.5)",
    )
    ap.add_argument("--latency-seconds", type=float, default=60.0, help="row 8's load lasts this")
    ap.add_argument("--latency-samples", type=int, default=200, help="row 8's samples at most")
    ap.add_argument("--json", type=Path, help="also write the JSON document here")
    args = ap.parse_args()
    gc_tuning.tune()  # the consumer rows run under the thresholds the splitbrain CLI sets
    with broker_with_topics("sbs", args.partitions) as (broker, topics):
        doc = nan_free(run(args, broker, topics))
    print_table(doc)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
