"""The alert rules and the Grafana dashboard against promtool and the metrics a worker exports.

promtool comes from Debian's `prometheus` package (`.ci/run` installs it). Without it the promtool
tests skip, saying so, unless SPLITBRAIN_REQUIRE_TOOLS=1 (set by `.ci/run`) fails them instead:
see `tests/conftest.py`.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from detector.contracts.findings import Severity, Status
from detector.contracts.page_state import SinkName
from detector.core import Counters, FindingStats, FindingUpdate, LeaseHealth
from detector.leases.gauges import LeaseGauges, OpenJobs
from detector.paging.delivery import DeliveryOutcome
from detector.paging.metrics import PageMetrics
from detector.telemetry.metrics import WorkerMetrics
from tests import docs
from tests.paths import ROOT

RULES = ROOT / "alerts" / "splitbrain.rules.yml"
RULE_TESTS = ROOT / "alerts" / "tests" / "splitbrain.rules.test.yml"
DASHBOARD = ROOT / "dashboards" / "splitbrain.json"
# Where each alert's runbook_url points: a page of the documentation site.
RUNBOOKS = ROOT / "docs" / "operating" / "alerts.md"

SEVERITIES = {"page", "ticket", "warning"}
TARGET_LABELS = {"job", "instance"}  # added by Prometheus to every scraped series
UNBOUNDED = {"workflow_key", "worker_id", "effect_key", "event_id", "finding_id"}
# What Grafana puts in a query before Prometheus sees it.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$job": "splitbrain",
    "$page_job": "splitbrain-page",
    "$relay_job": "splitbrain-relay",
}


# ---- promtool ---------------------------------------------------------------------------------


def run_promtool(promtool: str, *args: str | Path, cwd: Path = ROOT) -> tuple[int, str]:
    done = subprocess.run(
        [promtool, *map(str, args)],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, f"$ promtool {' '.join(map(str, args))}\n{done.stdout}{done.stderr}"


def test_rules_pass_promtool_check(promtool: str) -> None:
    code, out = run_promtool(promtool, "check", "rules", RULES.relative_to(ROOT))
    assert code == 0, out


def test_rules_pass_their_promtool_unit_tests(promtool: str) -> None:
    code, out = run_promtool(promtool, "test", "rules", RULE_TESTS.relative_to(ROOT))
    assert code == 0, out


@pytest.mark.parametrize(
    ("path", "old", "new", "alert"),
    [
        (RULES, "> 0.25", "> 0.5", "SplitbrainCommitLatencyHigh"),
        (RULES, 'severity="critical"', 'severity=~".+"', "SplitbrainCriticalFinding"),
        (
            RULES,
            "unless\n          (sum by (job, instance)",
            "or (sum by (job, instance)",
            "SplitbrainNotCommitting",
        ),
        (RULES, "late, not lost", "late", "SplitbrainTransactionsAborting"),
        (RULE_TESTS, "severity: warning", "severity: ticket", "SplitbrainEvidenceDropped"),
        (RULES, "> 120", "> 1200", "SplitbrainWorkerStalled"),
        (RULES, "< 120", "< 1200", "SplitbrainDetectionStalled"),
        (RULES, "lag_records[15m])) > 0", "lag_records[15m])) >= 0", "SplitbrainFallingBehind"),
        (RULES, "> 0.01", "> 0.1", "SplitbrainLeaseNearExpiry"),
        (RULES, "engine_errors_total[30m]", "engine_errors_total[5m]", "SplitbrainEngineError"),
        (
            RULES,
            'seconds_bucket{le="5.0"}',
            'seconds_bucket{le="+Inf"}',
            "SplitbrainLeaseNearExpiry",
        ),
    ],
)
def test_rule_tests_fail_when_a_rule_or_an_expectation_is_wrong(
    promtool: str, tmp_path: Path, path: Path, old: str, new: str, alert: str
) -> None:
    (tmp_path / "tests").mkdir()
    rules, tests = tmp_path / RULES.name, tmp_path / "tests" / RULE_TESTS.name
    shutil.copy(RULES, rules)
    shutil.copy(RULE_TESTS, tests)
    changed = rules if path == RULES else tests
    text = changed.read_text()
    assert old in text
    changed.write_text(text.replace(old, new, 1))
    code, out = run_promtool(promtool, "test", "rules", tests, cwd=tmp_path)
    assert code != 0, out
    assert f"alertname: {alert}" in out, out


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"splitbrain_dashboard:query_{i}", "expr": expr}
                    for i, (_, expr) in enumerate(dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    code, out = run_promtool(promtool, "check", "rules", path)
    assert code == 0, out + "\n" + path.read_text()


# ---- what the rules and the dashboard may reference -------------------------------------------


@functools.cache
def exported_samples() -> dict[str, set[str]]:
    """Sample name -> label names, from a fresh WorkerMetrics driven through each method once
    (a labelled metric has no sample until a label value is used)."""
    metrics = WorkerMetrics(CollectorRegistry())
    metrics.event("heartbeat", 0)
    metrics.dead_letter("invalid", 0)
    metrics.engine_error(0)
    metrics.finding_revision(
        FindingUpdate(
            SimpleNamespace(severity=Severity.CRITICAL, status=Status.OPEN, revision=1),  # type: ignore[arg-type]
            escalated=True,
        ),
        0,
    )
    metrics.state(0, 1)
    metrics.engine(0, Counters(effects_dropped=1, redelivered=1, evicted_idle=1))
    health = LeaseHealth(missed_heartbeats=2, jitter_reserve_s=5.0)
    stats = health.stats_of(("ocr", "tesseract-5", "local"))
    stats.lost = stats.early = 1
    stats.takeover_delay[0] = 1
    metrics.lease_health(0, health)
    findings = FindingStats()
    findings.zombie_seconds[Severity.CRITICAL].add(30.0)
    findings.zombie_seq[Severity.CRITICAL].add(3)
    findings.resolution[Severity.CRITICAL].add(60.0)
    metrics.finding_stats(0, findings)
    metrics.findings_open_age(0, 100.0, {Severity.CRITICAL: 40.0})
    metrics.committed(0.01, 10)
    metrics.aborted()
    metrics.restored(1.5, 1000)
    metrics.standby_lag(1, 3)
    metrics.consumer_lag(0, 5)
    metrics.findings_open(0, dict.fromkeys(Severity, 1))
    metrics.polled(1_764_512_000.0)
    samples: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        assert family.samples, f"{family.name}: not driven by this test, add it above"
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


@functools.cache
def bridge_samples() -> dict[str, set[str]]:
    """The same for the pager bridge (`splitbrain page`), which the dashboard shows too."""
    metrics = PageMetrics(list(SinkName), CollectorRegistry())
    metrics.answered(SinkName.WEBHOOK, DeliveryOutcome.ACCEPTED, 0.2)
    metrics.consumer_lag(0, 1)
    metrics.invalid.inc()
    samples: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


@functools.cache
def relay_samples() -> dict[str, set[str]]:
    """The same for the lease store's relay (`splitbrain leases relay --metrics-port`), which
    `SplitbrainRelayStalled` reads: its gauges with a label value each."""
    gauges = LeaseGauges(CollectorRegistry())
    gauges.stepped(1)
    labels = {"job_class": "ocr", "tool_class": "ocr", "model": "m", "provider": "p"}
    gauges.open_jobs.snapshot = (OpenJobs(labels, 1, 1, 0, (1.0, 1.0, 1.0), (1.0, 1.0, 1.0)),)
    samples: dict[str, set[str]] = {}
    for family in gauges.registry.collect():
        assert family.samples, f"{family.name}: not driven by this test, add it above"
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
STRING = r'"(?:[^"\\]|\\.)*"'
GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", re.IGNORECASE
)
SELECTOR = re.compile(rf"(?<![\w:.])({IDENT})?\s*\{{([^}}]*)\}}")
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}


def references(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The metric selectors of a PromQL expression with the labels they match on, and the labels
    of its grouping clauses (by, without, on, ignoring, group_left/right)."""
    grouping = {
        label.strip()
        for clause in GROUPING.findall(expr)
        for label in clause.split(",")
        if label.strip()
    }
    rest = GROUPING.sub(" ", expr)
    selectors: list[tuple[str, set[str]]] = []

    def selector(match: re.Match[str]) -> str:
        name, body = match.group(1), re.sub(STRING, '""', match.group(2))
        assert name, f"a selector without a metric name: {match.group(0)!r} in {expr!r}"
        selectors.append((name, set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", body))))
        return " "

    rest = SELECTOR.sub(selector, rest)
    rest = re.sub(STRING, " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    for match in re.finditer(rf"(?<![\w:.]){IDENT}(?![\w:])(?!\s*\()", rest):
        if match.group(0).lower() not in KEYWORDS:
            selectors.append((match.group(0), set()))
    return selectors, grouping


def rule_expressions() -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule["alert"], rule["expr"]


def grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr!r}"
    return expr


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[tuple[str, str]]:
    queries = [
        (f"panel {panel['title']!r}", grafana_to_promql(target["expr"]))
        for panel in panels()
        for target in panel.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            inner = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert inner, f"variable {variable['name']}: {query!r}"
            queries.append((f"variable {variable['name']}", inner.group(1)))
    return queries


def all_expressions() -> list[tuple[str, str]]:
    return [(f"alert {name}", expr) for name, expr in rule_expressions()] + dashboard_queries()


def test_the_reference_parser_finds_selectors_and_grouping() -> None:
    selectors, grouping = references(
        'histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{job=~"x=y", le!="1"}[5m])))'
        " / on (job) group_left b_total > bool 0 unless c offset 5m"
    )
    assert selectors == [("a_bucket", {"job", "le"}), ("b_total", set()), ("c", set())]
    assert grouping == {"job", "le"}


@pytest.mark.parametrize(("where", "expr"), all_expressions())
def test_every_metric_and_label_is_exported_by_a_worker(where: str, expr: str) -> None:
    """Or by the pager bridge, for the dashboard's Pager bridge row, or by the lease store's
    relay."""
    exported = exported_samples() | (bridge_samples() if "splitbrain_page_" in expr else {})
    exported |= relay_samples() if "splitbrain_lease_store_" in expr else {}
    selectors, grouping = references(expr)
    assert selectors, f"{where}: no metric found in {expr!r}"
    for name, _ in selectors:
        assert name == "up" or name in exported, f"{where}: {name} is not exported by a worker"
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name == "up" or any(s.startswith(base) for s in exported), f"{where}: {base}"
    for name, matched in selectors:
        known = TARGET_LABELS | (set() if name == "up" else exported[name])
        assert matched <= known, f"{where}: {name} has no label {matched - known}"
        assert grouping <= known, f"{where}: {name} has no label {grouping - known}"
        assert not (matched | grouping) & UNBOUNDED, f"{where}: an unbounded label"


def test_the_dashboard_shows_every_metric_a_worker_exports() -> None:
    shown = {name for _, expr in dashboard_queries() for name, _ in references(expr)[0]}
    exported = exported_samples()
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", name) for name in exported}
    missing = families - {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in shown}
    assert not missing, f"no panel shows {sorted(missing)}"
    assert {"splitbrain_page_deliveries", "splitbrain_page_delivery_latency_seconds"} <= {
        re.sub(r"_(bucket|sum|count|total)$", "", name) for name in shown
    }


def test_pager_panels_read_the_bridges_job_and_the_others_the_workers() -> None:
    """And the lease store relay's panels its job."""
    for panel in panels():
        for target in panel.get("targets", []):
            page = "splitbrain_page_" in target["expr"]
            relay = "splitbrain_lease_store_" in target["expr"]
            assert ('job=~"$page_job"' in target["expr"]) == page, panel["title"]
            assert ('job=~"$relay_job"' in target["expr"]) == relay, panel["title"]
            assert ('job=~"$job"' in target["expr"]) != (page or relay), panel["title"]


def test_known_label_values_are_exported_before_their_first_increment() -> None:
    """An alert on increase() cannot see a series that appears at 1."""
    text = "\n".join(
        f"{s.name}{sorted(s.labels.items())} {s.value}"
        for family in WorkerMetrics(CollectorRegistry()).registry.collect()
        for s in family.samples
    )
    assert "splitbrain_findings_escalated_total[('severity', 'critical')] 0.0" in text
    assert "splitbrain_transactions_total[('outcome', 'aborted')] 0.0" in text
    assert "splitbrain_engine_errors_total[] 0.0" in text


# ---- the rules as a reader meets them ---------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return rules


def test_every_alert_has_a_bounded_severity_and_says_what_to_do() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert [g["name"] for g in groups] == ["splitbrain"]
    anchors = docs.anchors(RUNBOOKS)
    for rule in alert_rules():
        name = rule["alert"]
        assert set(rule["labels"]) <= {"severity", "job"}, name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert len(annotations["description"]) > 100, name
        url = annotations["runbook_url"]
        assert url == f"docs/operating/alerts.md#{name.lower()}", name
        assert url.partition("#")[2] in anchors, f"{name}: no runbook heading for {url}"


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    cases = [
        case
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
    ]
    for rule in alert_rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case.get("exp_alerts") for case in mine), f"{rule['alert']} never fires"
        assert any(not case.get("exp_alerts") for case in mine), f"{rule['alert']} always fires"


def test_the_runbook_page_documents_the_severities() -> None:
    text = RUNBOOKS.read_text()
    for severity in SEVERITIES:
        assert f"| `{severity}` |" in text, severity


# ---- the dashboard as Grafana loads it --------------------------------------------------------


def test_dashboard_takes_its_datasource_from_a_variable() -> None:
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    sources = [p["datasource"] for p in panels() if p["type"] != "row"]
    sources += [t["datasource"] for p in panels() for t in p.get("targets", [])]
    sources += [v["datasource"] for v in variables.values() if "datasource" in v]
    assert sources
    for source in sources:
        assert source == {"type": "prometheus", "uid": "${datasource}"}, source
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))


def test_dashboard_has_the_panels_on_call_needs() -> None:
    titles = {p["title"] for p in panels()}
    assert {
        "Findings opened by severity",
        "Finding revisions by status",
        "Events by kind",
        "Dead letters by reason",
        "Transactions by outcome",
        "Commit latency",
        "Records per transaction",
        "Workflows tracked per partition",
        "Evidence dropped",
        "Evictions by cause",
        "State restore time",
        "Lease health",
        "Heartbeat age by tool class",
        "Lease time remaining at heartbeat by tool class",
        "Expired leases by tool class",
        "Lease extension failures by tool class",
        "Jobs reclaimed by tool class",
        "Oldest open finding by severity",
        "Finding time to resolution by severity",
        "Zombies",
        "Zombie activity after takeover (seconds, time range)",
        "Zombie activity after takeover (seq positions, time range)",
        "Zombie activity after takeover by severity",
        "Takeover delay after lease expiry by tool class",
        "Takeovers before lease expiry by tool class",
        "Pager bridge",
        "Pager deliveries by sink and outcome",
        "Pager delivery latency by sink",
    } <= titles
