"""The Grafana dashboard on real data: every panel query answers, from a real Prometheus.

Two workers on the local broker process a generated history with every condition (stale
activity, stale effect attempt, commit and rejection, duplicates by retry and by failover, lease
health with attrs, takeovers late and early, resolution by lease_lost and outcome_verified, by
silence, and findings left open); the pager bridge delivers their findings to a webhook; Debian's
Prometheus scrapes all three every second. Then every target expression of
dashboards/splitbrain.json goes through Prometheus' HTTP API (`/api/v1/query` at the end of the
run, Grafana's variables substituted for a dashboard whose time range is the run) and must be
valid and return data, except the panels named in `ALLOWED_EMPTY` with their reason.

The same answers (and `/api/v1/query_range` for the timeseries panels) are drawn by
scripts/render_dashboard.py: into the test's directory, and into docs/dashboard.png when
SPLITBRAIN_DASHBOARD_PNG names that file (how the README's picture was made).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from detector.devstack.worker import WorkerProcess, connection_env
from tests.integration.conftest import deploy
from tests.integration.deployment import Deployment, wait_for
from tests.integration.receiver import Receiver
from tests.integration.test_paging import serving, write_yaml
from tests.paths import ROOT
from tests.tools import program
from tests.unit.test_alerts_and_dashboards import dashboard, panels

RENDER = ROOT / "scripts" / "render_dashboard.py"
QUIET_S = 5  # the workers' quiet period: findings resolve by silence within the run
TOOLS = ("export", "browser", "indexer")
SCRAPE_S = 1
# Panels that can only be empty in this run, with the reason. Every other panel must show data,
# and a panel listed here that shows data fails the test: the list stays true. The pager bridge
# runs here, so its row has data too; the lease store's relay does not.
_NO_RELAY = "no lease store relay runs here: test_lease_gauges.py reads its gauges"
ALLOWED_EMPTY: dict[str, str] = {
    "Relay lag: oldest unrelayed outbox row, and time since each relay's last step": _NO_RELAY,
    "Expired leases not yet reclaimed, by job class and its labels": _NO_RELAY,
    "Oldest heartbeat and least lease left, by job class and its labels": _NO_RELAY,
    "Open jobs and outbox backlog": _NO_RELAY,
}

Event = dict[str, Any]


# ---- the history ------------------------------------------------------------------------------


class Flow:
    """One workflow's events in authoritative (`seq`) order; `t` is seconds on the emitters'
    clock after the history's start (`observed_at`, and `lease_until` from the coordinator)."""

    def __init__(self, wf: str, tool: str, t0: float) -> None:
        self.wf, self.tool, self.t0, self.seq = wf, tool, t0, 0

    def at(self, t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.t0 + t)) + "Z"

    def add(self, kind: str, epoch: int, t: float, **extra: Any) -> Event:
        self.seq += 1
        if "until" in extra:
            extra["lease_until"] = self.at(extra.pop("until"))
        return {
            "event_id": f"{self.wf}/{self.seq}",
            "kind": kind,
            "workflow_key": self.wf,
            "owner_epoch": epoch,
            "worker_id": f"worker-{epoch}",
            "seq": self.seq,
            "observed_at": self.at(t),
            **extra,
        }

    def acquire(self, epoch: int, t: float, until: float) -> Event:
        return self.add(
            "lease_acquired",
            epoch,
            t,
            source="coordinator",
            until=until,
            lease_duration_s=30,
            heartbeat_interval_s=10,
            attrs={"tool_class": self.tool, "model": "gpt-sim", "provider": "local"},
        )

    def effect(self, kind: str, epoch: int, t: float, key: str, source: str) -> Event:
        return self.add(kind, epoch, t, effect_key=f"{self.wf}/{key}", source=source)

    def verify(self, t: float, key: str) -> Event:
        return self.effect("outcome_verified", 0, t, key, "verifier")


def history(t0: float) -> tuple[list[Event], list[Event], list[Event]]:
    """Three phases: every workflow acquired; then what its owners (and zombies) do; then the
    verifications and lease losses that resolve most findings."""
    acquire: list[Event] = []
    act: list[Event] = []
    resolve: list[Event] = []
    for i in range(21):  # each of 7 scenarios once per tool class
        f = Flow(f"tenant-{i % 4}/dash/{i:03d}", TOOLS[i % 3], t0)
        acquire.append(f.acquire(1, 0, until=30))
        # the owner's heartbeats: gaps of 10, 10 and 13 s, 20, 20 and 17 s left on the lease
        act += [f.add("heartbeat", 1, t, until=t + 30) for t in (10, 20, 33)]
        scenario = i % 7
        if scenario == 0:  # healthy: an effect, verified, and a release
            act += [
                f.effect("effect_attempted", 1, 35, "out", "worker"),
                f.effect("effect_committed", 1, 36, "out", "destination"),
                f.verify(37, "out"),
                f.add("lease_released", 1, 38),
            ]
        elif scenario == 1:  # stale activity, 7 s after the lease ran out; then lease_lost
            act += [
                f.acquire(2, 70, until=100),
                f.add("progress", 1, 72),
                f.add("heartbeat", 2, 75, until=105),
                f.add("progress", 1, 80),
            ]
            resolve.append(f.add("lease_lost", 1, 85))
        elif scenario == 2:  # an early takeover; a stale attempt the destination rejects
            act += [
                f.acquire(2, 40, until=70),
                f.effect("effect_attempted", 1, 45, "mail", "worker"),
                f.effect("effect_rejected", 1, 46, "mail", "destination"),
            ]
            resolve.append(f.verify(60, "mail"))
        elif scenario == 3:  # a stale commit, then the new owner's: a failover duplicate
            act += [
                f.acquire(2, 90, until=120),
                f.add("progress", 1, 91),
                f.effect("effect_attempted", 1, 92, "index", "worker"),
                f.effect("effect_committed", 1, 95, "index", "destination"),
                f.effect("effect_committed", 2, 100, "index", "destination"),
            ]
            resolve += [f.add("lease_lost", 1, 101), f.verify(110, "index")]
        elif scenario == 4:  # a retry: the same effect committed twice by one owner
            act += [
                f.effect("effect_committed", 1, 35, "capture", "destination"),
                f.effect("effect_committed", 1, 36, "capture", "destination"),
            ]
            resolve.append(f.verify(50, "capture"))
        elif scenario == 5:  # a stale commit nobody verifies: stays open (critical)
            act += [
                f.acquire(2, 70, until=100),
                f.effect("effect_committed", 1, 75, "export", "destination"),
                f.add("lease_lost", 1, 76),
                f.add("ownership_uncertain", 2, 80),
            ]
        else:  # a zombie that goes quiet: resolved by silence on the worker's clock
            act += [f.acquire(2, 64, until=94), f.add("heartbeat", 1, 66)]
    return acquire, act, resolve


def records(events: list[Event]) -> list[tuple[bytes, bytes]]:
    return [(e["workflow_key"].encode(), json.dumps(e).encode()) for e in events]


# ---- Prometheus -------------------------------------------------------------------------------


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # a bad query: Prometheus says why
            doc = json.loads(err.read())
        return doc

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        doc = self.get("/api/v1/query", **params)
        assert doc["status"] == "success", f"{expr}: {doc.get('error')}"
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def total(self, expr: str) -> float:
        """The sum of an instant query's values; -1 when it has none."""
        result = self.query(expr)
        return sum(float(r["value"][1]) for r in result) if result else -1.0

    def scraped_after(self, moment: float) -> bool:
        """Whether every target was scraped after `moment` (a Unix time): what they exported
        then is in."""
        return self.total("min(timestamp(up))") > moment


def finite(series: list[dict[str, Any]]) -> bool:
    """Does any series have a number (not NaN) to show?"""
    for s in series:
        points = s.get("values") or [s["value"]]
        if any(not math.isnan(float(v)) for _, v in points):
            return True
    return False


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr!r}"
    return expr


# ---- receivers and the bridge -----------------------------------------------------------------


@contextmanager
def bridge(d: Deployment, workdir: Path, port: int, hook: Receiver) -> Iterator[None]:
    """`splitbrain page` on the deployment's findings, delivering to `hook`; killed by PID."""
    tag = uuid.uuid4().hex[:8]
    argv = [
        *(sys.executable, "-m", "detector.cli", "page"),
        *("--findings-topic", d.topics.findings, "--state-topic", f"it-dash-page-{tag}"),
        *("--group-id", f"it-dash-page-{tag}", "--metrics-port", str(port)),
    ]
    env = connection_env(
        d.config,
        SPLITBRAIN_PAGE_WEBHOOK_URL=hook.url,
        SPLITBRAIN_PAGE_WEBHOOK_SECRET="dashboard-test-secret",
    )
    log = workdir / "bridge.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)


# ---- the test ---------------------------------------------------------------------------------


def test_every_panel_query_returns_data_from_a_real_run(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    binary = program("prometheus", package="prometheus")
    d = deploy(kafka_broker, tmp_path, "kafka")
    # With standbys, so that the standby panel has its series: once the second worker joins,
    # each keeps the partitions it does not own warm.
    flags = ("--quiet-period-s", str(QUIET_S), "--standby", "all")
    w1 = d.group.worker("w1", *flags, metrics=True)
    w2 = d.group.worker("w2", *flags, metrics=True)
    workers: list[WorkerProcess] = [w1, w2]
    hook = Receiver()
    prom_port, page_port = free_port(), free_port()
    config = write_yaml(
        tmp_path / "prometheus.yml",
        {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "splitbrain",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{w.metrics_port}" for w in workers]}
                    ],
                },
                {
                    "job_name": "splitbrain-page",
                    "static_configs": [{"targets": [f"127.0.0.1:{page_port}"]}],
                },
            ],
        },
    )
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]
    prom = Prometheus(prom_port)
    try:
        with (
            serving(args, tmp_path / "prometheus.log", prom_port),
            bridge(d, tmp_path, page_port, hook),
        ):
            start = time.time()
            drive(prom, d, w1, w2)
            driven = time.time()
            wait_for(lambda: prom.scraped_after(driven), "the last of it scraped", 30)
            end = time.time()
            results = evaluate(prom, start, end)
    finally:
        d.close()
        hook.close()

    check_and_draw(results, tmp_path)


def check_and_draw(results: dict[str, Any], workdir: Path) -> None:
    """Every panel has data but those allowed to be empty; the picture of them is drawn."""
    empty = {p["title"] for p in results["panels"] if p["empty"]}
    assert empty == set(ALLOWED_EMPTY), "\n".join(
        f"{p['title']}: {t['expr']}"
        for p in results["panels"]
        if p["title"] in empty ^ set(ALLOWED_EMPTY)
        for t in p["targets"]
        if not t["data"]
    )
    data = workdir / "dashboard-data.json"
    data.write_text(json.dumps(results))
    outs = [workdir / "dashboard.png"]
    wanted = os.environ.get("SPLITBRAIN_DASHBOARD_PNG")
    if wanted:
        outs.append(Path(wanted).resolve())
    for out in outs:
        done = subprocess.run(
            [sys.executable, str(RENDER), str(data), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert out.stat().st_size > 50_000


def drive(prom: Prometheus, d: Deployment, w1: WorkerProcess, w2: WorkerProcess) -> None:
    """The run: the first worker, the history in phases, the second worker, the resolutions."""
    workers = [w1, w2]
    w1.start()
    wait_for(
        lambda: (
            prom.total('up{job="splitbrain"}') >= 1 and prom.total('up{job="splitbrain-page"}') == 1
        ),
        "Prometheus to scrape the first worker and the bridge",
        90,
        [w1],
    )
    acquire, act, resolve = history(time.time() - 120)
    valid = len(acquire) + len(act) + len(resolve)

    def processed(n: int, what: str, among: list[WorkerProcess]) -> None:
        """Until Prometheus scraped `n` events counted."""
        events = 'sum(splitbrain_events_total{job="splitbrain"})'
        wait_for(lambda: prom.total(events) >= n, what, 90, among)

    # Every label set first shows at 0, so that rate() sees the first observation.
    d.publish(records(acquire))
    processed(len(acquire), "the acquisitions", [w1])
    wait_for(
        lambda: prom.total("splitbrain_lease_heartbeat_age_seconds_count") == 0,
        "the lease-health label sets at 0",
        60,
        [w1],
    )
    # What the owners do, in three bursts (each scraped before the next), with bad input.
    third = len(act) // 3
    done = len(acquire)
    for burst in (act[:third], act[third : 2 * third], act[2 * third :]):
        d.publish(records(burst))
        done += len(burst)
        processed(done, "a burst of activity", [w1])
    d.publish([(b"tenant-0/dash/000", b"{not json")])  # a dead letter
    bad_field = {**act[0], "event_id": "bad-field", "seq": 1000, "lease_duration_s": -5}
    d.publish(records([bad_field, act[1]]))  # an invalid optional field; a redelivery
    processed(len(acquire) + len(act) + 1, "the activity", [w1])
    # A second worker joins: a rebalance, and restores from the changelog.
    w2.start()
    wait_for(
        lambda: (
            prom.total('sum(up{job="splitbrain"})') == 2
            and prom.total("sum(splitbrain_state_restore_seconds_count)") >= 3
        ),
        "the second worker to be scraped and both to restore",
        120,
        workers,
    )
    joined = time.time()
    wait_for(lambda: prom.scraped_after(joined), "a scrape of both after the rebalance", 30)
    d.publish(records(resolve))
    processed(valid + 1, "the resolutions", workers)
    resolved = "sum(splitbrain_finding_resolution_seconds_count)"
    # lease_lost + verified (scenarios 1, 3), verified (2, 4), silence (6): 3 of each
    wait_for(lambda: prom.total(resolved) >= 15, "15 findings resolved", 90, workers)
    wait_for(
        lambda: prom.total("sum(splitbrain_page_deliveries_total)") > 0,
        "the bridge to deliver",
        60,
        workers,
    )


def evaluate(prom: Prometheus, start: float, end: float) -> dict[str, Any]:
    """Every panel's queries: at `end` over the whole run (must be valid and have data), and
    over the run for the picture. Grafana's variables as for a dashboard showing the run."""
    span = f"{math.ceil(end - start) + 2 * SCRAPE_S}s"
    at_end = {
        "$__rate_interval": span,
        "$__interval": f"{SCRAPE_S}s",
        "$__range": span,
        "$job": "splitbrain",
        "$page_job": "splitbrain-page",
        "$relay_job": "splitbrain-relay",
    }
    # A graph of a two-minute range: Grafana's $__rate_interval is at least 4 scrape intervals.
    graphed = {**at_end, "$__rate_interval": f"{10 * SCRAPE_S}s"}
    out: list[dict[str, Any]] = []
    for panel in panels():
        if panel["type"] == "row":
            continue
        targets = []
        for target in panel["targets"]:
            instant = prom.query(substitute(target["expr"], at_end), at=end)
            series = instant
            if not target.get("instant"):
                doc = prom.get(
                    "/api/v1/query_range",
                    query=substitute(target["expr"], graphed),
                    start=f"{start:.3f}",
                    end=f"{end:.3f}",
                    step=f"{SCRAPE_S}",
                )
                assert doc["status"] == "success", f"{target['expr']}: {doc.get('error')}"
                series = doc["data"]["result"]
            else:
                series = [{"metric": s["metric"], "values": [s["value"]]} for s in instant]
            targets.append(
                {
                    "expr": target["expr"],
                    "legend": target.get("legendFormat", ""),
                    "instant": bool(target.get("instant")),
                    "data": finite(instant),
                    "series": series,
                }
            )
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        out.append(
            {
                "title": panel["title"],
                "type": panel["type"],
                "unit": defaults.get("unit", "short"),
                "decimals": defaults.get("decimals"),
                "thresholds": defaults.get("thresholds"),
                "targets": targets,
                "empty": not all(t["data"] for t in targets),
            }
        )
    return {"title": dashboard()["title"], "start": start, "end": end, "panels": out}
