"""The run of `splitbrain demo`: the product, live, on this machine, in under two minutes.

It starts the dev stack (`detector.devstack.stack`: a broker, two detector workers, PostgreSQL with
the lease store, the outbox relay, an unfenced example destination, Alertmanager, Prometheus
with the shipped alerting rules, the pager bridge), then a small fleet of agent workers
(`python -m detector.devstack.lease_worker`: real lease-store workers whose tool takes a couple
of seconds and then POSTs its effect to the destination) over a stream of jobs. While one agent
is inside its tool call it is paused (SIGSTOP) past its lease, as a GC pause or a network split
would; another agent takes the job over and commits; the paused one wakes (SIGCONT) and commits
too. With `--source SYSTEM` the zombie is another system's instead (Celery, Temporal, LangGraph,
etcd, Kubernetes: a module each beside this one), its real server and workers reporting through
splitbrain's adapter; the waiting for the finding and the page, and the verdict, are the same.
The demo prints, as they happen: the event rate, what the agents do around the pause, each
revision of the finding (as `splitbrain tail` prints it) and each alert Alertmanager holds; then
it stops everything it started.

Exit status: 0 the critical finding reached Alertmanager (through every path that runs: the
Prometheus rule SplitbrainCriticalFinding, and the pager bridge's SplitbrainFinding); 1 it did
not within `--timeout`, or a component failed; 2 the machine or a flag cannot be used (no Java,
a busy port, another demo on the same state directory), nothing started; 4 it ran, but a
missing Debian package (postgresql, prometheus, prometheus-alertmanager) left out a part, so the
live page was not fully shown and checked; 130 interrupted (Ctrl-C), everything stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from detector.demos import LEASES, DemoSource, load
from detector.errors import ExitCode, Interrupted

if TYPE_CHECKING:
    import psycopg
    from confluent_kafka import Consumer
    from psycopg.rows import DictRow

    from detector.devstack.components import Process
    from detector.devstack.stack import Stack
    from detector.kafka.findings import FindingsView
    from detector.leases.store import LeaseStore

PARTIAL: Final = 4  # ran, but a missing Debian package left a part out: the page was not checked
AGENTS: Final = 3
VICTIM: Final = "agent-2"
WORK_S: Final = "1.5:2.5"  # the stand-in tool's duration, then its POST to the destination
WARM_JOBS: Final = 3  # jobs done before the pause is armed
RATE_EVERY_S: Final = 2.0
ALERTS_EVERY_S: Final = 1.0
MAX_PAUSES: Final = 3
LINGER_S: Final = 600.0  # interactive: the stack stays up this long at most after the verdict
PROMETHEUS_ALERT: Final = "SplitbrainCriticalFinding"
PAGER_ALERT: Final = "SplitbrainFinding"


class Out:
    """Lines on stdout, each after the seconds since the demo began."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def __call__(self, line: str) -> None:
        from detector.report import printable  # noqa: PLC0415

        print(f"[{time.monotonic() - self.began:5.1f}s] {printable(line)}", flush=True)

    def block(self, lines: list[str], indent: int = 9) -> None:
        from detector.report import printable  # noqa: PLC0415

        for line in lines:
            print((" " * indent + printable(line)).rstrip(), flush=True)


@dataclass(frozen=True, slots=True)
class Demo:
    """What `splitbrain demo` was asked for."""

    state_dir: Path
    source: str  # one of `SOURCES`
    timeout_s: float  # from start to the page
    jobs: int
    job_rate: float  # jobs enqueued per second
    prometheus_port: int = 0  # 0: a free one
    alertmanager_port: int = 0
    destination_port: int = 0
    interactive: bool = False  # after the verdict, keep the stack up until Enter


def play(demo: Demo) -> int:
    """Run the demo; its exit status (the module's docstring says which). Stopped before
    anything started: `UnusableError` (2) or `Interrupted` (130)."""
    from detector.devstack.errors import UnusableError  # noqa: PLC0415
    from detector.devstack.interrupts import interrupts  # noqa: PLC0415
    from detector.devstack.preflight import Options, preflight  # noqa: PLC0415
    from detector.devstack.record import locked  # noqa: PLC0415
    from detector.devstack.stack import Stack  # noqa: PLC0415

    source = None if demo.source == LEASES else load(demo.source)
    missing = None if source is None else source.missing()
    if missing is not None:
        raise UnusableError(f"--source {demo.source}: {missing}")
    out = Out()
    interrupts.install()
    options = Options(
        prometheus_port=demo.prometheus_port,
        alertmanager_port=demo.alertmanager_port,
        destination_port=demo.destination_port,
        view=True,
    )
    try:
        with locked(demo.state_dir, "splitbrain demo"):
            tools = preflight(options, out)
            stack = Stack(
                demo.state_dir, options, tools, mode="demo", say=out, timeout=demo.timeout_s
            )
            return _run(stack, demo, out, source)
    except KeyboardInterrupt:  # before anything started (preflight, the lock)
        raise Interrupted("interrupted; nothing was running") from None


def _run(
    stack: Stack,
    demo: Demo,
    out: Out,
    source: DemoSource | None,
) -> int:
    from detector.devstack.errors import StackError  # noqa: PLC0415

    leftovers = stack.prepare()
    print(
        f"splitbrain demo: a live split-brain, detected and paged; state and logs in "
        f"{stack.dir} (stack.json lists every process)",
        flush=True,
    )
    if leftovers:
        out(f"stopped {leftovers} component(s) an earlier demo in {stack.dir} left running")
    for s in stack.skipped:
        out(f"skipped {s.name}: {s.reason}")
    code: int = ExitCode.FAILED
    scenario: Scenario | None = None
    try:
        stack.start()
        scenario = Scenario(stack, demo, out, source)
        code = scenario.run()
        if demo.interactive:
            _linger(stack, out)
    except KeyboardInterrupt:
        print("", flush=True)
        out("interrupted: stopping everything")
        code = ExitCode.INTERRUPTED
    except StackError as exc:
        lines = str(exc).splitlines()
        out(f"FAILED: {lines[0]}")
        out.block(lines[1:])
        code = ExitCode.FAILED
    finally:
        while True:  # a second Ctrl-C while stopping must not leave anything behind
            try:
                if scenario is not None:
                    scenario.close()
                _stop(stack, out)
                break
            except KeyboardInterrupt:
                continue
            except StackError as exc:
                out(f"could not stop everything: {exc}")
                code = ExitCode.FAILED
                break
    return code


def _stop(stack: Stack, out: Out) -> None:
    started = time.monotonic()
    running = [c for c in stack.components if not c.stopped]
    if running:
        out(f"stopping {len(running)} component(s), last started first")
        stack.stop()
    if stack.components:
        out(
            f"stopped everything in {time.monotonic() - started:.1f}s; no process of the demo "
            f"is left running (their PIDs: {stack.dir / 'stack.json'})"
        )


def _linger(stack: Stack, out: Out) -> None:
    """Interactive: keep the stack up so that the URLs can be opened, until Enter."""
    out(
        "everything still runs, so you can look around (URLs above); press Enter to stop it "
        f"(it stops by itself in {LINGER_S / 60:.0f} minutes)"
    )
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if ready:
            sys.stdin.readline()
            return


# ---------------------------------------------------------------------------- the scenario


@dataclass
class Pause:
    """The fault: the victim's execution caught inside its tool call, and what followed."""

    job: str
    token: int
    paused_at: float
    seq: int = 0
    taken_over_by: str | None = None
    other_committed: bool = False
    resumed_at: float | None = None
    narrated: set[tuple[str, int]] = field(default_factory=set)


class Scenario:
    """The fleet, the jobs, the pause and what the demo watches, run in one loop."""

    def __init__(
        self, stack: Stack, demo: Demo, out: Out, source: DemoSource | None = None
    ) -> None:
        from detector.leases.policy import JobClass, Labels  # noqa: PLC0415

        self.stack = stack
        self.source = source  # another system's zombie instead of the lease store's fleet
        self.source_started: float | None = None
        self.out = out
        self.jobs = demo.jobs
        self.timeout_s = demo.timeout_s
        self.job_every_s = 1.0 / demo.job_rate
        self.job_class = JobClass(
            name="payments",
            lease_s=3.0,
            heartbeat_s=0.5,
            missed_heartbeats=2,
            reserve_s=1.0,
            extend_timeout_s=0.5,  # the demo's PostgreSQL, on loopback, refuses at once
            max_attempts=3,
            # Above the pause: the victim's heartbeat thread must still try to extend after it
            # (and learn that its lease is lost) rather than think its executor hung.
            tool_timeout_s=30.0,
            stage_time_limit_s=60.0,
        )
        self.labels = Labels(tool_class="payments", provider="example-pay")
        self.agents: dict[str, Process] = {}
        self.store: LeaseStore | None = None
        self.consumer: Consumer | None = None
        self.view: FindingsView | None = None
        self.enqueued = 0
        self.pauses: list[Pause] = []
        self.armed_at: Any = None
        self.alerts_seen: set[str] = set()
        self.prometheus_paged = False
        self.pager_paged = False
        self.critical_at: float | None = None
        self.events_total: float | None = None
        self.events_at = 0.0
        self._db: psycopg.Connection[DictRow] | None = None

    # -- set up and tear down ------------------------------------------------------------

    def close(self) -> None:
        if self.source is not None:
            with contextlib.suppress(Exception):  # closing must not stop the cleanup
                self.source.stop()
        for closing in (self.consumer, self.store, self._db):
            if closing is not None:
                with contextlib.suppress(Exception):  # closing must not stop the cleanup
                    closing.close()
        self.consumer = self.store = self._db = None

    def _start_fleet(self) -> None:
        from detector.devstack.components import Process  # noqa: PLC0415
        from detector.devstack.worker import connection_env  # noqa: PLC0415
        from detector.leases.db import connect  # noqa: PLC0415
        from detector.leases.store import LeaseStore  # noqa: PLC0415

        dsn = self.stack.dsn
        url = self.stack.url("destination")
        assert dsn is not None and url is not None
        self.store = LeaseStore(dsn, [self.job_class])
        self._db = connect(dsn)
        c = self.job_class
        for n in range(1, AGENTS + 1):
            name = f"agent-{n}"
            agent = Process(
                name,
                urls={"destination": url},
                log=self.stack.dir / "logs" / f"{name}.log",
                argv=[
                    *(sys.executable, "-m", "detector.devstack.lease_worker", "--dsn", dsn),
                    *("--worker-id", name, "--job-class", c.model_dump_json()),
                    *("--work-s", WORK_S, "--destination-url", url, "--seed", str(n)),
                ],
                env=connection_env({}),
                stop_timeout=5.0,
            )
            self.stack.add(agent)
            self.agents[name] = agent
        pids = ", ".join(f"{n} pid {a.pids[0].pid}" for n, a in self.agents.items())
        self.out(
            f"started {AGENTS} agents ({pids}): lease-store workers of job class payments "
            f"(L={c.lease_s:g}s H={c.heartbeat_s:g}s R={c.missed_heartbeats} "
            f"J={c.reserve_s:g}s T={c.extend_timeout_s:g}s), a tool of "
            f"{WORK_S.replace(':', '-')}s then POST to the destination"
        )

    def _start_source(self, source: DemoSource) -> None:
        from detector.demos import DemoStack  # noqa: PLC0415
        from detector.devstack.worker import connection_env  # noqa: PLC0415

        config = self.stack.kafka_config
        self.out(f"running the {source.name} zombie, its events through splitbrain's adapter")
        source.start(
            DemoStack(
                bootstrap_servers=str(config["bootstrap.servers"]),
                env=connection_env(config),
                dsn=self.stack.dsn,
                logs=self.stack.dir / "logs",
                say=self.out,
                add=self.stack.add,
            )
        )
        self.source_started = time.monotonic()

    def _subscribe(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: PLC0415

        from detector.contracts.topics import FINDINGS_TOPIC  # noqa: PLC0415
        from detector.kafka.findings import FindingsView  # noqa: PLC0415

        consumer = Consumer(
            {
                **self.stack.kafka_config,
                "group.id": f"splitbrain-demo-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer = consumer
        topic = consumer.list_topics(FINDINGS_TOPIC, timeout=30).topics[FINDINGS_TOPIC]
        consumer.assign(
            [TopicPartition(FINDINGS_TOPIC, p, OFFSET_BEGINNING) for p in topic.partitions]
        )
        self.view = FindingsView()

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        stack = self.stack
        self._print_urls()
        self._subscribe()
        live = stack.dsn is not None and self.source is None
        if self.source is not None:
            self._start_source(self.source)
        elif live:
            self._start_fleet()
            self.out(
                f"enqueueing {self.jobs} payment jobs, {1 / self.job_every_s:g} a second; "
                f"{VICTIM} will be paused inside a tool call once {WARM_JOBS} jobs are done"
            )
        else:
            self._replay_fallback()
        next_job = next_alerts = time.monotonic()
        next_rate = next_job + RATE_EVERY_S
        self._rate()
        while True:
            now = time.monotonic()
            if live and self.enqueued < self.jobs and now >= next_job and not self.paged():
                self._enqueue()
                next_job += self.job_every_s
            if live:
                self._fault(now)
            if self.source is not None:
                self.source.poll()
            self._findings()
            if now >= next_rate:
                self._rate()
                next_rate += RATE_EVERY_S
            if now >= next_alerts and self.critical_at is not None:
                self._alerts()
                next_alerts += ALERTS_EVERY_S
            self._check_alive()
            if self.paged() or (self.critical_at is not None and not self._page_paths()):
                break
            if stack.left() <= 0:
                return self._verdict(timed_out=True)
            time.sleep(0.05)
        return self._verdict(timed_out=False)

    def _print_urls(self) -> None:
        stack = self.stack
        lines = []
        for label, comp, key in (
            ("Prometheus (alerts)", "prometheus", "alerts"),
            ("Alertmanager", "alertmanager", "ui"),
            ("Alertmanager API", "alertmanager", "url"),
            ("findings view", "view", "ui"),
        ):
            url = stack.url(comp, key)
            if url is not None:
                lines.append(f"{label:<22}{url}" + ("/api/v2/alerts" if key == "url" else ""))
        for w in stack.detectors:
            lines.append(f"{w.instance + ' metrics':<22}http://127.0.0.1:{w.metrics_port}/metrics")
        dest = stack.url("destination")
        if dest is not None:
            lines.append(f"{'destination':<22}{dest}/effects/<entity> (unfenced)")
        lines.append(f"{'bootstrap.servers':<22}{stack.kafka_config['bootstrap.servers']}")
        self.out("the stack is up:")
        self.out.block(lines)

    def _enqueue(self) -> None:
        assert self.store is not None
        self.enqueued += 1
        n = self.enqueued
        self.store.enqueue(
            "payments",
            f"payment:inv-{n:04d}:capture",
            {"entity": f"inv-{n:04d}", "amount_eur": 100 + n},
            self.labels,
        )

    @property
    def db(self) -> psycopg.Connection[DictRow]:
        assert self._db is not None
        return self._db

    def _jobs(self) -> dict[str, int]:
        rows = self.db.execute("SELECT state, count(*) AS n FROM tool_jobs GROUP BY state")
        return {r["state"]: int(r["n"]) for r in rows.fetchall()}

    def _rate(self) -> None:
        now = time.monotonic()
        total = 0.0
        for w in self.stack.detectors:
            total += sum(w.samples("splitbrain_events_total", "kind").values())
        line = f"events: {int(total)} processed"
        if self.events_total is not None and now > self.events_at:
            line += f", {(total - self.events_total) / (now - self.events_at):.1f}/s"
        self.events_total, self.events_at = total, now
        if self._db is not None:
            jobs = self._jobs()
            done = jobs.get("succeeded", 0) + jobs.get("failed", 0)
            line += (
                f" | jobs: {self.enqueued} enqueued, {jobs.get('running', 0)} running, {done} done"
            )
        self.out(line)

    # -- the fault --------------------------------------------------------------------------

    def _victim(self) -> Process:
        return self.agents[VICTIM]

    def _fault(self, now: float) -> None:
        pause = self.pauses[-1] if self.pauses else None
        if pause is None or (pause.resumed_at is not None and self._retry(pause)):
            self._arm_or_pause(now)
            return
        self._narrate(pause)
        if pause.resumed_at is None:
            paused_s = now - pause.paused_at
            lease = self.job_class.lease_s
            if (pause.other_committed and paused_s >= lease + 1.0) or paused_s >= lease + 10.0:
                self._victim_signal(signal.SIGCONT)
                pause.resumed_at = now
                self.out(
                    f"SIGCONT {VICTIM} after {paused_s:.1f}s paused (its lease was "
                    f"{lease:g}s): it wakes up inside its tool call"
                )

    def _retry(self, pause: Pause) -> bool:
        """The last pause led to no takeover (the victim may have held the job's row): try
        again on its next job, a few times."""
        assert pause.resumed_at is not None
        if pause.taken_over_by is not None or len(self.pauses) >= MAX_PAUSES:
            return False
        if time.monotonic() - pause.resumed_at < 1.0:
            return False
        self.out(f"no takeover happened during that pause: pausing {VICTIM} again on a later job")
        self.armed_at = None
        return True

    def _arm_or_pause(self, now: float) -> None:
        if self.armed_at is None:
            jobs = self._jobs()
            if jobs.get("succeeded", 0) < WARM_JOBS:
                return
            at = self.db.execute("SELECT now() AS at").fetchone()
            assert at is not None
            self.armed_at = at["at"]
            return
        row = self.db.execute(
            "SELECT job_id, seq, (event->>'fencing_token')::bigint AS token FROM tool_job_outbox"
            " WHERE event->>'kind' = 'tool_request_started' AND event->>'owner_id' = %s"
            " AND created_at > %s ORDER BY created_at DESC LIMIT 1",
            (VICTIM, self.armed_at),
        ).fetchone()
        if row is None:
            return
        self._victim_signal(signal.SIGSTOP)
        pause = Pause(str(row["job_id"]), int(row["token"]), now, seq=int(row["seq"]))
        self.pauses.append(pause)
        self.out(
            f"{VICTIM} (pid {self._victim().pids[0].pid}) is inside its tool call for job "
            f"{pause.job} (token {pause.token}): SIGSTOP, as a GC pause or a network split would"
        )

    def _victim_signal(self, sig: int) -> None:
        pid = self._victim().pids[0]
        if pid.alive():
            os.kill(pid.pid, sig)

    def _narrate(self, pause: Pause) -> None:
        """What the lease store records for the paused job, as it commits."""
        rows = self.db.execute(
            "SELECT seq, event FROM tool_job_outbox WHERE job_id = %s AND seq > %s ORDER BY seq",
            (pause.job, pause.seq),
        ).fetchall()
        for row in rows:
            pause.seq = int(row["seq"])
            event = row["event"]
            kind, token, owner = event["kind"], int(event["fencing_token"]), event["owner_id"]
            if (kind, token) in pause.narrated:
                continue
            if kind == "job_claimed" and token > pause.token:
                pause.taken_over_by = owner
                self.out(
                    f"{owner} claimed job {pause.job} (token {token}): {VICTIM}'s lease expired "
                    "while it was paused"
                )
            elif kind == "effect_committed" and token > pause.token:
                pause.other_committed = True
                self.out(f"{owner} committed the payment at example-pay (token {token})")
            elif kind == "effect_committed" and token == pause.token:
                self.out(
                    f"{VICTIM} sent its request anyway: example-pay (unfenced) committed the "
                    f"payment a second time, under the stale token {token}"
                )
            elif kind == "heartbeat_lost" and token == pause.token:
                self.out(
                    f"{VICTIM}'s heartbeat finds its lease lost (token {token}), but its tool "
                    "call's request is already on its way"
                )
            elif kind == "result_rejected" and token == pause.token:
                self.out(f"{VICTIM}'s result is refused by the job store (token {token})")
            else:
                continue
            pause.narrated.add((kind, token))

    # -- what the detector and the pager say ---------------------------------------------------

    def _findings(self) -> None:
        from detector.contracts.findings import Severity  # noqa: PLC0415
        from detector.kafka.findings import one_line  # noqa: PLC0415

        assert self.consumer is not None and self.view is not None
        for msg in self.consumer.consume(100, timeout=0):
            if msg.error() is not None:
                continue
            finding = self.view.add(msg)
            if finding is None:
                continue
            self.out(f"finding: {one_line(finding)}")
            if finding.severity is Severity.CRITICAL and self.critical_at is None:
                self.critical_at = time.monotonic()
                self._print_link(finding.finding_id)

    def _print_link(self, finding_id: str) -> None:
        """Where the page's link goes: the finding in the view (`page --finding-url`)."""
        from detector.paging.links import FindingLink  # noqa: PLC0415

        template = self.stack.url("view", "finding")
        if template is not None:
            self.out(f"the finding in the view: {FindingLink(template).of(finding_id)}")

    def _critical_ids(self) -> set[str]:
        assert self.view is not None
        return {f.finding_id for f in self.view.findings.values() if f.severity.value == "critical"}

    def _page_paths(self) -> list[str]:
        """The paths a critical finding reaches Alertmanager by, among the components running."""
        names = {c.name for c in self.stack.components}
        paths = []
        if "alertmanager" in names and "prometheus" in names:
            paths.append(PROMETHEUS_ALERT)
        if "alertmanager" in names and "pager" in names:
            paths.append(PAGER_ALERT)
        return paths

    def paged(self) -> bool:
        paths = self._page_paths()
        got = {PROMETHEUS_ALERT: self.prometheus_paged, PAGER_ALERT: self.pager_paged}
        return bool(paths) and all(got[p] for p in paths)

    def _alerts(self) -> None:
        url = self.stack.url("alertmanager")
        if url is None:
            return
        try:
            with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=5) as answer:
                alerts: list[dict[str, Any]] = json.loads(answer.read())
        except (OSError, ValueError):
            return
        critical = self._critical_ids()
        for alert in alerts:
            labels: dict[str, str] = alert.get("labels", {})
            state = (alert.get("status") or {}).get("state", "?")
            seen = f"{alert.get('fingerprint')}:{state}"
            if seen not in self.alerts_seen:
                self.alerts_seen.add(seen)
                self._print_alert(labels, alert.get("annotations", {}), state)
            if state != "active" or labels.get("severity") != "page":
                continue
            if labels.get("alertname") == PROMETHEUS_ALERT:
                self.prometheus_paged = True
            elif labels.get("alertname") == PAGER_ALERT and labels.get("finding_id") in critical:
                self.pager_paged = True

    def _print_alert(self, labels: dict[str, str], notes: dict[str, str], state: str) -> None:
        name = labels.get("alertname", "?")
        rest = " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        self.out(f"alertmanager holds {name} ({state}): {rest}")
        lines = []
        for key, value in notes.items():
            wrapped = textwrap.wrap(
                f"{key}: {value}", 100, subsequent_indent="    ", break_on_hyphens=False
            )
            lines += wrapped or [f"{key}:"]
        self.out.block(lines, indent=11)

    # -- the end ----------------------------------------------------------------------------

    def _check_alive(self) -> None:
        from detector.devstack.errors import StackError  # noqa: PLC0415
        from detector.devstack.process import log_tail  # noqa: PLC0415

        for comp in self.stack.components:
            if not comp.stopped and comp.pids and not comp.running():
                raise StackError(
                    f"{comp.name} stopped unexpectedly (log: {comp.log})\n{log_tail(comp.log)}"
                )

    def _verdict(self, *, timed_out: bool) -> int:
        from detector.contracts.topics import FINDINGS_TOPIC  # noqa: PLC0415
        from detector.kafka.findings import summary  # noqa: PLC0415

        if self.critical_at is not None and not self.paged():
            self._alerts()  # one last look
        assert self.view is not None
        if self.view.findings:
            self.out("the findings, as `splitbrain tail` reports them:")
            self.out.block(summary(self.view, FINDINGS_TOPIC).rstrip("\n").splitlines())
        if self._db is not None:
            jobs = self._jobs()
            tally = ", ".join(f"{n} {state}" for state, n in sorted(jobs.items()))
            self.out(f"jobs: {tally} (of {self.enqueued} enqueued)")
        paths = self._page_paths()
        live = self.stack.dsn is not None or self.source is not None
        # A source that needs PostgreSQL says so in `missing()`; the others run without it. The
        # view is an extra, not a Debian package: the page is checked without it.
        ignored = {"pager", "view"} if self.source is None else {"pager", "view", "postgres"}
        partial = [s.name for s in self.stack.skipped if s.name not in ignored]
        if self.paged():
            assert self.critical_at is not None
            got = " and ".join(paths)
            woke = next((p.resumed_at for p in reversed(self.pauses) if p.resumed_at), None)
            if self.source is not None and self.source_started is not None:
                since = (
                    f"{time.monotonic() - self.source_started:.1f}s after the "
                    f"{self.source.name} zombie started"
                )
            elif woke is not None:
                since = f"{time.monotonic() - woke:.1f}s after {VICTIM} woke up"
            else:
                since = "after the replayed split-brain"
            self.out(f"PAGED: the critical finding reached Alertmanager ({got}), {since}")
            if partial:
                self.out(
                    f"PARTIAL: left out for missing Debian packages: {', '.join(partial)} "
                    f"(exit {PARTIAL})"
                )
                return PARTIAL
            return ExitCode.OK
        if not paths and (self.critical_at is not None or not live):
            self.out(
                "NOT CHECKED: the critical finding "
                + ("was published" if self.critical_at is not None else "was not seen")
                + ", but without "
                + " and ".join(s for s in ("prometheus", "alertmanager") if s in partial)
                + f" it cannot be paged (exit {PARTIAL})"
            )
            return PARTIAL
        what = (
            "no critical finding was published"
            if self.critical_at is None
            else f"the critical finding did not reach Alertmanager ({' and '.join(paths)})"
        )
        within = f" within --timeout {self.timeout_s:g}s" if timed_out else ""
        self.out(f"FAILED: {what}{within}; logs in {self.stack.dir / 'logs'}")
        return ExitCode.FAILED

    def _replay_fallback(self) -> None:
        """Without PostgreSQL no agent runs: replay the published acceptance history instead,
        so that the rest of the product still shows what it does."""
        from detector import bundled  # noqa: PLC0415
        from detector.devstack.worker import connection_env  # noqa: PLC0415

        name = bundled.ACCEPTANCE_HISTORY
        self.out(f"no lease store, so no live split-brain: replaying {name} instead")
        with bundled.on_disk(name) as history:
            proc = subprocess.run(
                [sys.executable, "-m", "detector.cli", "replay", str(history)],
                env=connection_env(self.stack.kafka_config),
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
        if proc.returncode != 0:
            self.out(f"replay failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
