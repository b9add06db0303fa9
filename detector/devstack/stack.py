"""The whole product on one machine, on loopback: the stack of `splitbrain demo`, of
`splitbrain dev up|down|status` and of the demo's test.

Components, in the order they start (and the reverse of the order they stop):

- `kafka`: the broker (`LocalKafka`, its jars from Maven Central; Java 17+), then the topics of
  the bundled `topics/topics.yaml` (`topics apply --profile local`: the product's own topic names);
- `postgres`: PostgreSQL (`LocalPostgres`, Debian's `postgresql`) with the lease store migrated
  in database `jobs`;
- `destination`: the example destination over HTTP (`splitbrain leases destination`,
  unfenced unless `Options.fenced`);
- `relay`: the outbox relay (`splitbrain leases relay`) to `agent.ownership.v1`;
- `detector-N`: `splitbrain worker` processes in one group, each with /metrics (`WorkerProcess`);
- `alertmanager`: Alertmanager (Debian's `prometheus-alertmanager`), holding what it is sent;
- `prometheus`: Prometheus (Debian's `prometheus`) with the bundled `alerts/splitbrain.rules.yml`
  (copied into its directory), scraping the detectors and evaluating every second, sending to
  Alertmanager;
- `view`: the findings view (`splitbrain ui`, the `ui` extra), on loopback (`Options.view`).
- `pager`: the pager bridge (`splitbrain page --alertmanager-url`, `--finding-url` to the view).

Each runs as a process of its own session (a terminal's Ctrl-C reaches only the command that
started them, which stops them), with its log in `STATE_DIR/logs/`. Each is recorded, as soon
as it is spawned, in `STATE_DIR/stack.json` (its PIDs with their start times, so that a recycled
PID is never signalled, its URLs and its data), so that what one command started another can
stop (`splitbrain dev down`), and is stopped by PID: SIGTERM (SIGINT for PostgreSQL's fast
shutdown), then SIGKILL to its process group. A component whose Debian package is missing is
skipped with one line that says what to install; Java (and Maven, until the jars are cached)
is required. `record.locked` keeps two commands off one state directory.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

from detector import bundled
from detector.contracts.topics import DLQ_TOPIC, FINDINGS_TOPIC, GROUP_ID, INPUT_TOPIC
from detector.devstack.components import (
    Component,
    DetectorWorker,
    Kafka,
    Postgres,
    Process,
    pid_note,
)
from detector.devstack.errors import StackError
from detector.devstack.interrupts import interrupts
from detector.devstack.kafka_cluster import LocalKafkaCluster
from detector.devstack.monitoring import alertmanager, prometheus
from detector.devstack.preflight import Options, Say, Skipped, Tools
from detector.devstack.process import free_port, http_ok, port_open
from detector.devstack.record import SCHEMA, STATE_FILE, now, stop_recorded, write_json
from detector.devstack.topics import WorkerTopics
from detector.devstack.worker import WorkerProcess, connection_env

DESTINATION_NAME: Final = "example-pay"
_TOPIC_ATTEMPTS: Final = 5
_OWNED: Final = ("kafka", "detectors", "prometheus", "alertmanager", "logs", STATE_FILE)


class Stack:
    """The stack in `state_dir`: `start()` brings every component up in order, within
    `timeout` seconds, and stops what it started if anything fails or is interrupted;
    `stop()` stops them in reverse (idempotent); `add()` starts one more (the demo's agents),
    stopped with the rest. Also a context manager."""

    def __init__(
        self,
        state_dir: Path,
        options: Options,
        tools: Tools,
        *,
        mode: str,
        say: Say = print,
        timeout: float = 120.0,
    ) -> None:
        self.dir = state_dir.resolve()
        self.options = options
        self.tools = tools
        self.mode = mode
        self.say = say
        self.deadline = time.monotonic() + timeout
        self.components: list[Component] = []
        self.skipped: list[Skipped] = list(tools.skipped)
        self.topics = WorkerTopics(INPUT_TOPIC, FINDINGS_TOPIC, DLQ_TOPIC, GROUP_ID)
        self.kafka: Kafka | None = None
        self.postgres: Postgres | None = None
        self.detectors: list[WorkerProcess] = []
        self._started_at = now()
        self._saving = threading.Lock()
        self._background: threading.Thread | None = None
        self._background_error: BaseException | None = None

    # -- what it offers -------------------------------------------------------------------

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def kafka_config(self) -> dict[str, Any]:
        assert self.kafka is not None
        return self.kafka.client_config()

    @property
    def dsn(self) -> str | None:
        return None if self.postgres is None else self.postgres.urls.get("dsn")

    def url(self, component: str, key: str = "url") -> str | None:
        for comp in self.components:
            if comp.name == component:
                return comp.urls.get(key)
        return None

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def env(self) -> dict[str, str]:
        """The variables that point a `splitbrain` command (or a worker) at this stack."""
        out = {"SPLITBRAIN_BOOTSTRAP_SERVERS": str(self.kafka_config["bootstrap.servers"])}
        if self.dsn is not None:
            out["SPLITBRAIN_LEASES_DSN"] = self.dsn
        return out

    # -- life -------------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component, last started first (every process is asked at once, then
        each is waited for; the broker and the database go last); every one is tried even when
        one fails."""
        errors = []
        with interrupts.ignored():
            if self._background is not None:
                self._background.join()  # a start in flight ends (bounded by its own timeouts)
            for comp in reversed(self.components):
                if isinstance(comp, Process) and not comp.stopped:
                    comp.signal_stop()
            for comp in reversed(self.components):
                if comp.stopped:
                    continue
                try:
                    comp.stop()
                except (StackError, OSError) as exc:
                    errors.append(f"{comp.name}: {exc}")
            self.save(running=False)
        if errors:
            raise StackError("; ".join(errors))

    def add(self, comp: Component) -> Component:
        """Start `comp` and wait until it is ready; on failure it is stopped with the rest."""
        if self.left() <= 0:
            raise StackError(f"the stack did not start in time (before {comp.name})")
        self.components.append(comp)
        comp.start(self)
        self.save()
        comp.wait_ready(self.deadline)
        return comp

    def save(self, *, running: bool = True) -> None:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "mode": self.mode,
            "state_dir": str(self.dir),
            "owner_pid": os.getpid(),
            "started_at": self._started_at,
            "running": running,
            "components": [c.record() for c in self.components],
            "skipped": [{"name": s.name, "reason": s.reason} for s in self.skipped],
        }
        if self.kafka is not None and self.kafka.urls:
            doc["env"] = self.env()
        if not running:
            doc["stopped_at"] = now()
        with self._saving:
            write_json(self.dir / STATE_FILE, doc)

    def prepare(self) -> int:
        """Stop what an earlier run in this directory left running (a run killed by SIGKILL),
        then clear what the stack owns there; how many components were stopped."""
        self.dir.mkdir(parents=True, exist_ok=True)
        stopped = stop_recorded(self.dir, lambda line: None)
        for name in _OWNED:
            path = self.dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        (self.dir / "logs").mkdir()
        return stopped

    def _start(self) -> None:
        if self.tools.postgres:
            # PostgreSQL starts on a thread while the broker starts here: both mostly wait.
            self.postgres = Postgres("postgres", kind="postgres")
            self.components.append(self.postgres)
            self._background = threading.Thread(
                target=self._start_in_background, args=(self.postgres,), daemon=True
            )
            self._background.start()
        self.kafka = Kafka("kafka", kind="kafka")
        self.add(self.kafka)
        self.say(
            f"started kafka         {self.kafka.urls['bootstrap.servers']}{pid_note(self.kafka)}"
        )
        self.say(f"topics: {self.apply_topics()}")
        if self.postgres is not None:
            self._lease_store(self.postgres)
        self._detectors()
        if self.tools.alertmanager is not None:
            alertmanager(self, self.tools.alertmanager)
        if self.tools.prometheus is not None:
            prometheus(self, self.tools.prometheus)
        if self.tools.view:
            self._view()
        if self.tools.pager:
            self._pager()
        self.save()

    def _start_in_background(self, comp: Component) -> None:
        try:
            comp.start(self)
            comp.wait_ready(self.deadline)
        except BaseException as exc:
            self._background_error = exc  # raised again on the main thread

    def _lease_store(self, postgres: Postgres) -> None:
        """PostgreSQL (started in the background), the example destination, the relay."""
        assert self._background is not None
        while self._background.is_alive():  # joined in steps: Ctrl-C must get through
            self._background.join(0.1)
        if self._background_error is not None:
            raise self._background_error
        self.say(f"started postgres      {postgres.urls['dsn']}{pid_note(postgres)}")
        dsn = postgres.urls["dsn"]
        env = connection_env(self.kafka_config)
        port = self.options.destination_port or free_port()
        mode = [] if self.options.fenced else ["--unfenced"]
        url = f"http://127.0.0.1:{port}"
        dest = Process(
            "destination",
            urls={"url": url},
            log=self.dir / "logs" / "destination.log",
            argv=[
                *(sys.executable, "-m", "detector.cli", "leases", "destination", "--dsn", dsn),
                *("--port", str(port), "--name", DESTINATION_NAME, *mode),
            ],
            env=env,
            ready=functools.partial(port_open, port),
        )
        self.add(dest)
        fenced = "fenced" if self.options.fenced else "UNFENCED: accepts every fence"
        self.say(f"started destination   {url} ({fenced}){pid_note(dest)}")
        relay = Process(
            "relay",
            urls={"topic": INPUT_TOPIC},
            log=self.dir / "logs" / "relay.log",
            argv=[sys.executable, "-m", "detector.cli", "leases", "relay", "--dsn", dsn],
            env=env,
        )
        self.add(relay)
        self.say(f"started relay         tool_job_outbox -> {INPUT_TOPIC}{pid_note(relay)}")

    def _detectors(self) -> None:
        """The detector workers, in one group on the product's topics; started together and
        waited for together (each takes a few seconds to join)."""
        started = []
        for n in range(1, self.options.detectors + 1):
            worker = WorkerProcess(
                self.kafka_config,
                self.topics,
                self.dir / "detectors",
                instance=f"detector-{n}",
                metrics_port=free_port(),
            )
            comp = DetectorWorker(
                f"detector-{n}",
                urls={"metrics": f"http://127.0.0.1:{worker.metrics_port}/metrics"},
                log=worker.log,
                worker=worker,
                ready=functools.partial(_polling, worker),
                stop_timeout=30.0,
            )
            self.components.append(comp)
            comp.start(self)
            self.detectors.append(worker)
            started.append(comp)
        for comp in started:
            comp.wait_ready(self.deadline)
            self.say(f"started {comp.name:<13} {comp.urls['metrics']}{pid_note(comp)}")

    def _view(self) -> None:
        """`splitbrain ui` on loopback: the link of each page goes to its finding there
        (`/healthz` says when it has read the findings topic)."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        view = Process(
            "view",
            urls={"ui": url + "/", "finding": url + "/findings/{finding_id}"},
            log=self.dir / "logs" / "view.log",
            argv=[
                *(sys.executable, "-m", "detector.cli", "ui", "--listen", f"127.0.0.1:{port}"),
            ],
            env=connection_env(self.kafka_config),
            # Not waited for: the pager needs only its address, and it is up long before the
            # first finding (a view that dies is noticed as any component is).
        )
        self.add(view)
        self.say(f"started view          splitbrain ui {url}/{pid_note(view)}")

    def _pager(self) -> None:
        am = self.url("alertmanager")
        assert am is not None
        port = free_port()
        metrics = f"http://127.0.0.1:{port}/metrics"
        finding = self.url("view", "finding")
        link = [] if finding is None else ["--finding-url", finding]
        pager = Process(
            "pager",
            urls={"metrics": metrics},
            log=self.dir / "logs" / "pager.log",
            argv=[
                *(sys.executable, "-m", "detector.cli", "page", "--alertmanager-url", am),
                *("--metrics-port", str(port), "--retry-max-s", "5", *link),
            ],
            env=connection_env(self.kafka_config),
            ready=functools.partial(http_ok, metrics),
        )
        self.add(pager)
        self.say(f"started pager         splitbrain page -> {am}{pid_note(pager)}")

    def apply_topics(self) -> str:
        """`splitbrain topics apply --profile local` on one broker, the default (production)
        profile on a cluster: the product's topic names and settings."""
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415

        from detector.kafka.admin import execute, load_topics, plan  # noqa: PLC0415
        from detector.kafka.config import KafkaClientError  # noqa: PLC0415

        profile = "local" if self.options.brokers == 1 else None
        admin = AdminClient({**self.kafka_config, "log_level": 5})
        topics = load_topics(bundled.resource(bundled.TOPICS), profile)
        # A cluster that has just formed can drop the admin client's request ("Broker handle
        # destroyed"), and its brokers learn new topics one by one ("Unknown topic or partition"
        # from one that has not yet): the plan is idempotent, so plan again and finish the rest.
        created: list[str] | None = None
        for attempt in range(_TOPIC_ATTEMPTS):
            try:
                todo = plan(admin, topics, 30.0)
                created = [t.name for t in todo.create] if created is None else created
                if not todo.empty:
                    execute(admin, todo, 30.0, validate_only=False)
                break
            except KafkaClientError:
                if attempt == _TOPIC_ATTEMPTS - 1:
                    raise
                time.sleep(1.0)
        cluster = self.kafka.broker if self.kafka is not None else None
        if isinstance(cluster, LocalKafkaCluster):
            # A new topic reaches the brokers one by one: a worker that asks a slow one first is
            # told it does not exist, and exits.
            for topic in topics:
                cluster.wait_topic(topic.name)
        names = ", ".join(created or ()) or "none to create"
        return f"applied {bundled.TOPICS} (profile {profile or 'default'}): {names}"


def _polling(worker: WorkerProcess) -> bool:
    """The worker serves /metrics and has polled its input (it joined the group)."""
    polls = [
        value
        for (name, _), value in worker.metrics().items()
        if name == "splitbrain_worker_last_poll_timestamp_seconds"
    ]
    return bool(polls) and max(polls) > 0
