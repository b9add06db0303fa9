"""`splitbrain page` for real: a local broker, the bridge as an operator runs it (a subprocess
stopped by PID), Debian's Alertmanager on loopback with a webhook receiver behind it, a local
PagerDuty Events v2 endpoint and a signed webhook.

Lost findings records are simulated with DeleteRecords: the findings topic's log start moves past
every record, exactly what retention does to old segments, while the offsets stay valid."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families

from detector.contracts.findings import Finding
from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from detector.devstack.topics import create_topics, read_committed
from detector.devstack.worker import connection_env
from detector.paging.webhook import SIGNATURE_HEADER, verify
from detector.report import printable, witness
from detector.testing.pagerduty import PagerDutyReceiver
from tests.integration.conftest import deploy
from tests.integration.deployment import audited, fixture_lines, keyed
from tests.integration.receiver import Receiver
from tests.integration.test_paging import serving, write_yaml
from tests.paths import SEED_FIXTURE
from tests.tools import program
from tests.unit.test_paging_state import RESOLUTION, revisions

KEY = "R0UT1NGKEYintegration0123456789a"
HMAC_KEY = "webhook-hmac-key-for-tests"
DEADLINE_S = 90.0
REVS = revisions()  # the acceptance history's finding: info, warning, critical, critical, resolved


def variant(finding: Finding, finding_id: str, workflow_key: str) -> Finding:
    return finding.model_copy(update={"finding_id": finding_id, "workflow_key": workflow_key})


# ---- receivers --------------------------------------------------------------------------------


def firing(notification: dict[str, Any]) -> list[dict[str, str]]:
    return [a["labels"] for a in notification["alerts"] if a["status"] == "firing"]


@contextmanager
def alertmanager(workdir: Path, hook: Receiver) -> Iterator[str]:
    """Debian's Alertmanager on loopback: every alert of a finding is one group, notified to
    `hook` within a second of a change, and never repeated within the test."""
    binary = program("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
    port = free_port()
    config = write_yaml(
        workdir / "alertmanager.yml",
        {
            "route": {
                "receiver": "hook",
                "group_by": ["finding_id"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "hook", "webhook_configs": [{"url": hook.url}]}],
        },
    )
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.path={workdir / 'am'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with serving(args, workdir / "alertmanager.log", port):
        yield f"http://127.0.0.1:{port}"


def active_alerts(am_url: str) -> dict[str, dict[str, Any]]:
    """The SplitbrainFinding alerts Alertmanager holds active (it lists no resolved alert),
    by finding id."""
    query = urllib.parse.quote('alertname="SplitbrainFinding"')
    with urllib.request.urlopen(f"{am_url}/api/v2/alerts?filter={query}", timeout=5) as resp:
        alerts = json.loads(resp.read())
    return {a["labels"]["finding_id"]: a for a in alerts}


def updated_after(alert: dict[str, Any], moment: float) -> bool:
    updated = datetime.fromisoformat(alert["updatedAt"].replace("Z", "+00:00"))
    return updated.timestamp() > moment


# ---- the bridge process -----------------------------------------------------------------------


@dataclass
class BridgeProcess:
    config: Mapping[str, Any]
    findings: str
    workdir: Path
    sinks: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # names group and state topic
    instance: str = "b1"
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def state_topic(self) -> str:
        return f"it-page-state-{self.tag}"

    @property
    def log(self) -> Path:
        return self.workdir / f"bridge-{self.tag}-{self.instance}.log"

    def start(self) -> None:
        argv = [
            *(sys.executable, "-m", "detector.cli", "page"),
            *("--findings-topic", self.findings, "--state-topic", self.state_topic),
            *("--group-id", f"it-page-{self.tag}", "--metrics-port", str(self.metrics_port)),
            *("--alertmanager-resend-interval-s", "1", "--http-timeout-s", "5"),
            *("--retry-initial-s", "0.2", "--retry-max-s", "2", "--shutdown-timeout-s", "3"),
            *self.sinks,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=connection_env(self.config, **self.env),
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM, and its exit status."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(60)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def samples(self, name: str, **labels: str) -> list[float]:
        """`name`'s samples with these labels (none while /metrics does not answer)."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return []
        return [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def sample(self, name: str, **labels: str) -> float:
        """Their sum; -1 while there is none."""
        found = self.samples(name, **labels)
        return sum(found) if found else -1.0


def until(condition: Callable[[], bool], what: str, bridge: BridgeProcess) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        tail = "\n".join(bridge.text().splitlines()[-40:])
        assert bridge.alive(), f"the bridge exited {bridge.proc and bridge.proc.poll()}:\n{tail}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S:.0f}s waiting for {what}\n{tail}")
        time.sleep(0.1)


def settled(bridge: BridgeProcess) -> bool:
    """Every record read, delivered, saved and committed: nothing waits for a sink and the
    committed offsets are at the end of the findings topic."""
    lag = bridge.samples("splitbrain_page_consumer_lag_records")
    return bool(lag) and sum(lag) == 0 and bridge.sample("splitbrain_page_deliveries_pending") == 0


# ---- Kafka ------------------------------------------------------------------------------------


def findings_topic(config: Mapping[str, Any], partitions: int = 3) -> str:
    name = f"it-page-findings-{uuid.uuid4().hex[:8]}"
    create_topics(config, [NewTopic(name, partitions, 1)])
    return name


def publish(
    config: Mapping[str, Any],
    topic: str,
    *records: Finding | tuple[bytes, bytes],
    spread: int | None = None,
) -> None:
    """Keyed by workflow, as the worker publishes; with `spread`, the i-th record to partition
    i % spread instead of its key's."""
    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 5})
    for i, record in enumerate(records):
        if isinstance(record, Finding):
            key, value = record.workflow_key.encode(), record.to_json().encode()
        else:
            key, value = record
        if spread is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, partition=i % spread)
    assert producer.flush(30) == 0


def delete_every_record(config: Mapping[str, Any], topic: str) -> None:
    admin = AdminClient(dict(config))
    parts = admin.list_topics(topic, timeout=30).topics[topic].partitions
    futures = admin.delete_records([TopicPartition(topic, p, OFFSET_END) for p in parts])
    for future in futures.values():
        future.result(30)
    # What a new reader of the topic sees now: nothing.
    for p in parts:
        low, high = admin_watermarks(config, topic, p)
        assert low == high, (p, low, high)


def admin_watermarks(config: Mapping[str, Any], topic: str, partition: int) -> tuple[int, int]:
    from confluent_kafka import Consumer  # noqa: PLC0415

    consumer = Consumer({**config, "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        return int(low), int(high)
    finally:
        consumer.close()


def critical_findings(count: int, name: str) -> tuple[list[Finding], list[Finding]]:
    """`count` critical findings, each of a workflow of its own, and their resolutions."""
    opened = [variant(REVS[2], f"sb-it-{name}{i}", f"tenant-{i}/{name}") for i in range(count)]
    return opened, [variant(REVS[4], f.finding_id, f.workflow_key) for f in opened]


def one_group(
    config: Mapping[str, Any], topic: str, workdir: Path, pd: PagerDutyReceiver
) -> tuple[BridgeProcess, BridgeProcess]:
    """Two bridges (not started) of one group and state topic, paging `pd`."""
    env = {"SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": KEY}
    first = BridgeProcess(config, topic, workdir, ("--pagerduty-url", pd.url), env)
    return first, BridgeProcess(config, topic, workdir, first.sinks, env, first.tag, "b2")


def takes_over_and_resolves(
    bridge: BridgeProcess,
    topic: str,
    partitions: int,
    resolved: list[Finding],
    pd: PagerDutyReceiver,
) -> None:
    """`bridge` comes to own every partition of `topic` and restores the open findings; then
    it takes their resolutions and resolves every incident."""
    until(
        lambda: len(bridge.samples("splitbrain_page_consumer_lag_records")) == partitions,
        f"bridge {bridge.instance} to own every partition",
        bridge,
    )
    until(
        lambda: bridge.sample("splitbrain_page_findings_open") == len(resolved),
        f"{len(resolved)} findings open",
        bridge,
    )
    publish(bridge.config, topic, *resolved, spread=partitions)
    until(
        lambda: all(inc.status == "resolved" for inc in pd.incidents.values()),
        "every incident resolved",
        bridge,
    )


# ---- the tests --------------------------------------------------------------------------------


B = "sb-it-b"
B_REVS = [variant(f, B, "tenant-b/sync") for f in REVS[:2]]  # opens at info, then warning
WANT = {
    REVS[0].finding_id: ("page", "stale_effect_committed"),
    B: ("ticket", "stale_effect_attempt"),
}


@dataclass
class Scene:
    """The first test's world: a findings topic, the bridge with all three sinks, and what each
    sink received."""

    config: Mapping[str, Any]
    topic: str
    am_url: str
    pd: PagerDutyReceiver
    notified: Receiver  # Alertmanager's notifications
    signed: Receiver  # the bridge's own webhook
    bridge: BridgeProcess

    def shown(self) -> dict[str, tuple[str, str]]:
        return {
            fid: (al["labels"]["severity"], al["labels"]["condition"])
            for fid, al in active_alerts(self.am_url).items()
        }

    def incidents(self) -> dict[str, tuple[str, str]]:
        out = {}
        for key in WANT:
            inc = self.pd.incident(key)
            if inc is not None:
                out[key] = (inc.status, inc.events[-1]["payload"]["severity"])
        return out

    def quiet(self, fid: str, severity: str) -> bool:
        """Alertmanager notified the finding's current alert, and nothing else is pending."""
        sent = self.notified.notifications(fid)
        return bool(sent) and [x["severity"] for x in firing(sent[-1])] == [severity]


def test_sinks_follow_findings_across_a_sigkill_and_records_gone_from_the_findings_topic(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    config = kafka_broker.client_config()
    topic = findings_topic(config)
    notified, signed = Receiver(), Receiver()
    bridge: BridgeProcess | None = None
    try:
        with alertmanager(tmp_path, notified) as am_url, PagerDutyReceiver(KEY) as pd:
            bridge = BridgeProcess(
                config,
                topic,
                tmp_path,
                sinks=("--alertmanager-url", am_url, "--pagerduty-url", pd.url),
                env={
                    "SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": KEY,
                    "SPLITBRAIN_PAGE_WEBHOOK_URL": signed.url,
                    "SPLITBRAIN_PAGE_WEBHOOK_SECRET": HMAC_KEY,
                },
            )
            scene = Scene(config, topic, am_url, pd, notified, signed, bridge)
            bridge.start()
            publish(config, topic, REVS[0], REVS[1], REVS[2], *B_REVS)
            _one_alert_per_open_finding(scene)
            _one_incident_each_and_signed_revisions(scene)
            until(
                lambda: scene.quiet(REVS[0].finding_id, "page") and scene.quiet(B, "ticket"),
                "Alertmanager's notifications",
                bridge,
            )
            notified_before = {fid: len(notified.notifications(fid)) for fid in WANT}
            pd_before = len(pd.requests)
            _sigkill_and_lose_the_findings_records(scene)
            _resolve_once(scene, notified_before, pd_before)
            assert bridge.stop() == 0
            log = bridge.text()
            assert "bridge stopped cleanly" in log
            assert KEY not in log and HMAC_KEY not in log
    finally:
        if bridge is not None:
            bridge.kill()
        notified.close()
        signed.close()


def _one_alert_per_open_finding(scene: Scene) -> None:
    a = REVS[0].finding_id
    until(lambda: scene.shown() == WANT, "both findings' alerts in Alertmanager", scene.bridge)
    alert = active_alerts(scene.am_url)[a]
    assert alert["labels"] == {
        "alertname": "SplitbrainFinding",
        "severity": "page",
        "finding_id": a,
        "workflow_key": "export-ledger",
        "condition": "stale_effect_committed",
    }
    notes = alert["annotations"]
    assert notes["witness"] == printable(witness(REVS[2]))
    assert notes["response"] == REVS[2].response
    assert notes["runbook_url"] == "docs/operating/alerts.md#splitbrainfinding"
    assert notes["summary"].startswith("CRITICAL split-brain in export-ledger")


def _one_incident_each_and_signed_revisions(scene: Scene) -> None:
    want = {REVS[0].finding_id: ("triggered", "critical"), B: ("triggered", "warning")}
    until(lambda: scene.incidents() == want, "PagerDuty incidents", scene.bridge)
    until(lambda: settled(scene.bridge), "the batch committed", scene.bridge)
    assert scene.signed.hits, "the webhook got nothing"
    for hit in scene.signed.hits:
        assert verify(HMAC_KEY.encode(), hit.body, hit.headers.get(SIGNATURE_HEADER))
    latest = {d["finding_id"]: d["revision"] for d in scene.signed.documents()}
    assert latest == {REVS[0].finding_id: 3, B: 2}


def _sigkill_and_lose_the_findings_records(scene: Scene) -> None:
    """SIGKILL; every record of the findings topic is gone (as after its retention); the
    restarted bridge rebuilds the open set from its state topic and sends it again."""
    b = scene.bridge
    b.kill()
    delete_every_record(scene.config, scene.topic)
    restarted = time.time()
    b.start()
    until(lambda: b.sample("splitbrain_page_findings_open") == 2, "2 open findings", b)
    until(
        lambda: (
            len(alerts := active_alerts(scene.am_url)) == 2
            and all(updated_after(al, restarted) for al in alerts.values())
        ),
        "Alertmanager to be sent the open findings again",
        b,
    )
    assert scene.shown() == WANT


def _resolve_once(scene: Scene, notified_before: dict[str, int], pd_before: int) -> None:
    """The resolution: one more notification (resolved) for its finding, none for the other;
    PagerDuty gets the resolve and nothing else since the restart."""
    a, b = REVS[0].finding_id, scene.bridge
    publish(scene.config, scene.topic, REVS[4])
    until(lambda: a not in active_alerts(scene.am_url), "the alert to resolve", b)
    until(
        lambda: (
            len(sent := scene.notified.notifications(a)) > notified_before[a]
            and sent[-1]["status"] == "resolved"
        ),
        "the resolved notification",
        b,
    )
    (ended,) = scene.notified.notifications(a)[-1]["alerts"]
    assert ended["status"] == "resolved"
    assert ended["labels"]["severity"] == "page"
    ends = datetime.fromisoformat(ended["endsAt"].replace("Z", "+00:00"))
    assert ends <= datetime.now(UTC)
    until(
        lambda: (inc := scene.pd.incident(a)) is not None and inc.status == "resolved",
        "PagerDuty's resolve",
        b,
    )
    until(lambda: settled(b), "the resolution committed", b)
    sent = scene.notified.notifications(a)
    assert len(sent) == notified_before[a] + 1, [firing(n) for n in sent]
    assert len(scene.notified.notifications(B)) == notified_before[B]
    after = [r.event for r in scene.pd.requests[pd_before:]]
    assert [(e or {}).get("event_action") for e in after] == ["resolve"]
    assert [(e or {}).get("dedup_key") for e in after] == [a]
    assert all(inc.opened == 1 for inc in scene.pd.incidents.values())
    assert {d["finding_id"]: d["revision"] for d in scene.signed.documents()}[a] == 5


XS = {name: variant(REVS[2], f"sb-it-{name}", f"tenant-{name}/job") for name in "xyzwv"}


def _triggered(pd: PagerDutyReceiver, name: str) -> bool:
    inc = pd.incident(XS[name].finding_id)
    return inc is not None and inc.status == "triggered"


def test_retries_back_off_a_refusal_is_a_dead_letter_and_a_down_sink_holds_the_offsets(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    config = kafka_broker.client_config()
    topic = findings_topic(config)
    with PagerDutyReceiver(KEY) as pd:
        bridge = BridgeProcess(
            config,
            topic,
            tmp_path,
            sinks=("--pagerduty-url", pd.url),
            env={"SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": KEY},
        )
        try:
            bridge.start()
            _refusals_for_now_are_retried_with_backoff(config, topic, pd, bridge)
            _a_dead_letter_and_bad_records_block_nothing(config, topic, pd, bridge)
            _a_down_sink_holds_the_offsets_and_loses_nothing(config, topic, pd, bridge)
            assert all(inc.opened == 1 for inc in pd.incidents.values())
            assert bridge.proc is not None
            cmdline = Path(f"/proc/{bridge.proc.pid}/cmdline").read_bytes()
            assert KEY.encode() not in cmdline
            assert bridge.stop() == 0
            assert KEY not in bridge.text()
        finally:
            bridge.kill()


def _refusals_for_now_are_retried_with_backoff(
    config: Mapping[str, Any], topic: str, pd: PagerDutyReceiver, b: BridgeProcess
) -> None:
    """429, 429, 500: sent again, each wait longer than the one before."""
    pd.fail_next(429, 2)
    pd.fail_next(500, 1)
    publish(config, topic, XS["x"])
    until(lambda: _triggered(pd, "x"), "x to be taken after the refusals", b)
    tries = pd.attempts(XS["x"].finding_id)
    assert [t.status for t in tries] == [429, 429, 500, 202]
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(tries)]
    # --retry-initial-s 0.2: the n-th wait is within [0.1, 0.2] x 2^(n-1)
    for n, gap in enumerate(gaps):
        assert gap >= 0.1 * 2**n, gaps
    assert gaps[0] < gaps[2], gaps
    retried = b.sample("splitbrain_page_deliveries_total", sink="pagerduty", outcome="retried")
    assert retried == 3


def _a_dead_letter_and_bad_records_block_nothing(
    config: Mapping[str, Any], topic: str, pd: PagerDutyReceiver, b: BridgeProcess
) -> None:
    y = XS["y"]
    pd.refuse(y.finding_id, 400)
    publish(config, topic, y, (b"k", b"not json"), (b"k", b'{"schema": "x"}'), XS["z"])
    until(lambda: _triggered(pd, "z"), "z after the dead letter and the bad records", b)
    until(lambda: "dead letter: sink=pagerduty" in b.text(), "the dead-letter line", b)
    until(lambda: settled(b), "offsets committed past them", b)
    log = b.text()
    assert (
        f"dead letter: sink=pagerduty finding={y.finding_id} revision=3 action=trigger "
        "status=400" in log
    )
    skipped = [line for line in log.splitlines() if f"skipped {topic}[" in line]
    assert len(skipped) == 2, skipped
    assert all("not a valid splitbrain.finding/v1" in line for line in skipped)
    assert b.sample("splitbrain_page_invalid_records_total") == 2
    assert b.sample("splitbrain_page_deliveries_total", outcome="dead_letter") == 1
    assert len(pd.attempts(y.finding_id)) == 1  # never sent again


def _a_down_sink_holds_the_offsets_and_loses_nothing(
    config: Mapping[str, Any], topic: str, pd: PagerDutyReceiver, b: BridgeProcess
) -> None:
    pd.fail_next(503, 100_000)
    publish(config, topic, XS["w"])
    until(
        lambda: b.sample("splitbrain_page_deliveries_pending", sink="pagerduty") == 1,
        "w to wait for PagerDuty",
        b,
    )
    publish(config, topic, XS["v"])  # read only once w is taken
    until(lambda: b.sample("splitbrain_page_consumer_lag_records") >= 2, "the lag to show", b)
    retried = b.sample("splitbrain_page_deliveries_total", outcome="retried")
    until(
        lambda: b.sample("splitbrain_page_deliveries_total", outcome="retried") > retried,
        "more retries",
        b,
    )
    # SIGTERM while a delivery waits: it gets --shutdown-timeout-s, then the bridge exits 0
    # without committing; the next start sends it.
    assert b.stop() == 0
    assert "stopping with 1 delivery(ies) not taken (pagerduty 1)" in b.text()
    pd.recover()
    b.start()
    until(lambda: _triggered(pd, "w") and _triggered(pd, "v"), "w and v after the restart", b)
    until(lambda: settled(b), "everything committed", b)


def test_the_acceptance_history_pages_once_and_resolves(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    """The issue's "done when": the published history through a real worker, the findings topic,
    `splitbrain page` and a real Alertmanager: one alert for export-ledger with its witness and
    response; after lease_lost and outcome_verified the same alert resolved; SIGKILLs of the
    bridge on the way add no notification."""
    deployment = deploy(kafka_broker, tmp_path, "kafka")
    notified = Receiver()
    (expected,) = [
        Finding.model_validate(f)
        for f in audited(fixture_lines()).values()
        if f["workflow_key"] == "export-ledger"
    ]
    fid = expected.finding_id
    bridge = BridgeProcess(deployment.config, deployment.topics.findings, tmp_path, sinks=())
    try:
        with alertmanager(tmp_path, notified) as am_url:
            bridge.sinks = ("--alertmanager-url", am_url)
            b = bridge
            deployment.worker()
            b.start()
            replayed = deployment.cli(
                "replay", str(SEED_FIXTURE), "--topic", deployment.topics.input
            )
            assert replayed.returncode == 0, replayed.stderr

            def the_alert() -> dict[str, Any] | None:
                alerts = active_alerts(am_url)
                assert set(alerts) <= {fid}, alerts  # one finding, one alert: nothing else
                return alerts.get(fid)

            until(
                lambda: (
                    (al := the_alert()) is not None
                    and al["labels"]["condition"] == "duplicate_effect"
                ),
                "the export-ledger alert at its final revision",
                b,
            )
            alert = the_alert()
            assert alert is not None
            assert alert["labels"] == {
                "alertname": "SplitbrainFinding",
                "severity": "page",
                "finding_id": fid,
                "workflow_key": "export-ledger",
                "condition": "duplicate_effect",
            }
            assert alert["annotations"]["witness"] == printable(witness(expected))
            assert alert["annotations"]["response"] == expected.response
            until(
                lambda: (
                    bool(sent := notified.notifications(fid))
                    and [x["condition"] for x in firing(sent[-1])] == ["duplicate_effect"]
                ),
                "the page notification",
                b,
            )
            until(lambda: settled(b), "the bridge committed", b)
            before = len(notified.notifications(fid))

            # ---- SIGKILL mid-run: the restarted bridge re-sends, and nothing is notified again
            b.kill()
            restarted = time.time()
            b.start()
            until(
                lambda: (al := the_alert()) is not None and updated_after(al, restarted),
                "the alert sent again after the restart",
                b,
            )

            # ---- the displaced epoch 17 knows it lost; the verifier confirms the effect
            deployment.publish(keyed([json.dumps(e).encode() for e in RESOLUTION]))
            b.kill()  # and once more, before or while the bridge reads the resolution
            b.start()
            until(lambda: the_alert() is None, "the alert to resolve", b)
            until(
                lambda: (
                    len(sent := notified.notifications(fid)) > before
                    and sent[-1]["status"] == "resolved"
                ),
                "the resolved notification",
                b,
            )
            until(lambda: settled(b), "the bridge committed the resolution", b)
            sent = notified.notifications(fid)
            assert len(sent) == before + 1, [firing(n) for n in sent]
            (ended,) = sent[-1]["alerts"]
            assert ended["labels"]["finding_id"] == fid
            assert datetime.fromisoformat(ended["endsAt"].replace("Z", "+00:00")) <= datetime.now(
                UTC
            )
            assert b.stop() == 0
    finally:
        bridge.kill()
        deployment.close()
        notified.close()


def test_two_bridges_share_the_partitions_and_one_takes_over_the_others_state(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    """Two bridges in one group: each finding is triggered once, by the bridge of its partition;
    when one is killed the other is assigned its partitions, restores their state from the
    co-partitioned state topic and triggers nothing again; it resolves them all."""
    config = kafka_broker.client_config()
    topic = findings_topic(config, partitions=4)
    opened, resolved = critical_findings(8, "job")
    with PagerDutyReceiver(KEY) as pd:
        first, second = one_group(config, topic, tmp_path, pd)
        try:
            first.start()
            second.start()
            until(
                lambda: (
                    len(first.samples("splitbrain_page_consumer_lag_records")) == 2
                    and len(second.samples("splitbrain_page_consumer_lag_records")) == 2
                ),
                "the four partitions shared by the two bridges",
                second,
            )
            publish(config, topic, *opened, spread=4)
            until(lambda: len(pd.incidents) == 8, "eight incidents", second)
            until(lambda: settled(first) and settled(second), "both committed", second)
            triggers = len(pd.requests)
            assert triggers == 8
            for bridge in (first, second):  # each took the findings of its two partitions
                assert bridge.text().count("pagerduty took trigger") == 4, bridge.text()
            first.kill()
            takes_over_and_resolves(second, topic, 4, resolved, pd)
            actions = [(r.event or {}).get("event_action") for r in pd.requests[triggers:]]
            assert actions == ["resolve"] * 8
            assert all(inc.opened == 1 for inc in pd.incidents.values())
            assert second.stop() == 0
        finally:
            first.kill()
            second.kill()


def test_a_restore_reads_the_state_topic_past_an_undecided_transaction(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    """The bridge's restore is the worker's (`detector.kafka.stateful.recovery`): a state record
    in a transaction still open when the bridge is assigned is waited for, not skipped. A bridge
    that skipped it would know nothing of the finding, and trigger it again."""
    config = kafka_broker.client_config()
    topic = findings_topic(config, partitions=1)
    with PagerDutyReceiver(KEY) as pd:
        env = {"SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": KEY}
        first = BridgeProcess(config, topic, tmp_path, ("--pagerduty-url", pd.url), env)
        second = BridgeProcess(config, topic, tmp_path, first.sinks, env, instance="b2")
        try:
            first.start()
            publish(config, topic, REVS[2])
            until(lambda: len(pd.incidents) == 1 and settled(first), "one incident", first)
            assert first.stop() == 0
            saved = [(r.key, r.value) for r in read_committed(config, first.state_topic)]
            assert saved, "the first bridge saved no state"
            # The second bridge, in a group of its own, reads the finding again: its state topic
            # holds the first one's state, in a transaction decided only once it restores.
            state_topic = NewTopic(second.state_topic, 1, 1, config={"cleanup.policy": "compact"})
            create_topics(config, [state_topic])
            owner = Producer({**config, "transactional.id": f"it-page-prev-{second.tag}"})
            owner.init_transactions(30)
            owner.begin_transaction()
            for key, value in saved:
                owner.produce(second.state_topic, key=key, value=value, partition=0)
            owner.flush(30)
            second.start()
            until(lambda: "is undecided" in second.text(), "the restore to wait for it", second)
            owner.commit_transaction(30)
            until(lambda: settled(second), "the finding read again and committed", second)
            assert second.sample("splitbrain_page_findings_open") == 1
            assert len(pd.requests) == 1, [r.event for r in pd.requests]
            assert second.stop() == 0
        finally:
            first.kill()
            second.kill()


def test_a_resolved_finding_is_tombstoned_and_a_restart_pages_nothing_again(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    """Page-state keeps what a restart needs and no more: a finding resolved at every sink and
    older than `--resolved-retention-s` (1 s here) is tombstoned on the state topic and dropped
    from memory; killed and restarted, the bridge restores only the open finding and sends
    PagerDuty nothing again."""
    config = kafka_broker.client_config()
    topic = findings_topic(config, partitions=1)
    (gone, kept), (resolution, _) = critical_findings(2, "tomb")
    with PagerDutyReceiver(KEY) as pd:
        env = {
            "SPLITBRAIN_PAGE_PAGERDUTY_ROUTING_KEY": KEY,
            "SPLITBRAIN_PAGE_RESOLVED_RETENTION_S": "1",
        }
        bridge = BridgeProcess(config, topic, tmp_path, ("--pagerduty-url", pd.url), env)
        try:
            bridge.start()
            publish(config, topic, gone, kept)
            until(lambda: len(pd.incidents) == 2 and settled(bridge), "two incidents", bridge)
            publish(config, topic, resolution)

            def tombstoned() -> bool:
                latest = {r.key: r.value for r in read_committed(config, bridge.state_topic)}
                return latest.get(gone.finding_id.encode()) == b"" and bool(
                    latest.get(kept.finding_id.encode())
                )

            until(tombstoned, "the resolved finding's tombstone", bridge)
            assert (inc := pd.incident(gone.finding_id)) is not None and inc.status == "resolved"
            until(lambda: settled(bridge), "the resolution committed", bridge)
            sent = len(pd.requests)
            bridge.kill()
            bridge.start()
            until(
                lambda: len(re.findall(r"finding\(s\) restored", bridge.text())) == 2,
                "the restart's restore",
                bridge,
            )
            assert re.findall(r"(\d+) finding\(s\) restored", bridge.text())[-1] == "1"
            until(lambda: settled(bridge), "the restarted bridge caught up", bridge)
            assert bridge.sample("splitbrain_page_findings_open") == 1
            assert len(pd.requests) == sent, [r.event for r in pd.requests[sent:]]
            assert bridge.stop() == 0
        finally:
            bridge.kill()
