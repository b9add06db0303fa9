"""The Kubernetes manifests (`deploy/kubernetes/`) without a cluster: every object passes the
schema of its kind as a real kube-apiserver v1.35 and the Prometheus Operator's CRDs declare it
(strictly: an unknown field fails), the PrometheusRule is what `splitbrain export alerts`
writes, each container sets only variables and flags its command reads, secrets come only from
Secret references, probes ask the endpoints the processes serve, and the pods run unprivileged.
The server-side dry run against a real API server is the slow job's
(tests/integration/test_kubernetes_dry_run.py)."""

from __future__ import annotations

import argparse
import copy
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from detector.cli.main import build_parser
from detector.cli.reference import settings_variables
from detector.settings import ENV_PREFIX
from tests import kubernetes_manifests as k8s
from tests.paths import ROOT

OBJECTS: Final = k8s.render()
# The variables whose values are secrets: only from a Secret, never a value or a ConfigMap.
SECRET_VARIABLE: Final = re.compile(r"PASSWORD|SECRET|TOKEN|ROUTING_KEY|DSN")
SPLITBRAIN_VARIABLE: Final = re.compile(rf"\b{ENV_PREFIX}[A-Z0-9_]*[A-Z0-9]\b")


def by_kind(kind: str) -> list[k8s.Object]:
    return [o for o in OBJECTS if o["kind"] == kind]


def one(kind: str, name: str) -> k8s.Object:
    (found,) = (o for o in by_kind(kind) if o["metadata"]["name"] == name)
    return found


def workloads() -> list[tuple[k8s.Object, Mapping[str, Any]]]:
    return [(o, spec) for o in OBJECTS if (spec := k8s.pod_spec(o)) is not None]


def command_parser(args: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The `splitbrain` subcommand parser the container's args name, and the args after it."""
    parser = build_parser()
    words = list(args)
    while words and not words[0].startswith("-"):
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:
            break
        (action,) = subparsers
        parser = action.choices[words.pop(0)]
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=200)
    return parser, words


def test_the_base_renders_every_file_of_it_once() -> None:
    listed = yaml.safe_load((k8s.BASE / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(
        p.name for p in k8s.BASE.glob("*.yaml") if p.stem != "kustomization"
    )
    names = [k8s.name_of(o) for o in OBJECTS]
    assert len(names) == len(set(names)), names
    assert {o["kind"] for o in OBJECTS} == {
        "ServiceAccount",
        "ConfigMap",
        "Job",
        "Service",
        "StatefulSet",
        "PodDisruptionBudget",
        "Deployment",
        "PodMonitor",
        "PrometheusRule",
    }


def test_a_kustomization_that_is_more_than_plain_resources_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(k8s.ManifestError, match="namePrefix"):
        k8s.render(tmp_path)


@pytest.mark.parametrize("obj", OBJECTS, ids=k8s.name_of)
def test_every_object_passes_its_kinds_schema(obj: k8s.Object) -> None:
    assert k8s.validate(obj) == []


def test_the_schemas_are_the_servers_and_the_operators() -> None:
    assert k8s.openapi()["source"] == "kube-apiserver 1.35"
    version = (k8s.SCHEMAS / "prometheus-operator.version").read_text().split()
    assert version[0] == "github.com/prometheus-operator/prometheus-operator"
    assert {
        "monitoring.coreos.com/v1/PodMonitor",
        "monitoring.coreos.com/v1/PrometheusRule",
    } <= set(k8s.crds())


def test_the_check_refuses_what_the_api_server_would() -> None:
    """The validation is not vacuous: each kind of mistake a hand edit makes is caught."""
    worker = copy.deepcopy(one("StatefulSet", "splitbrain-worker"))
    container = worker["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["httpGet"]["paht"] = "/metrics"
    container["ports"][0]["containerPort"] = "9100"
    worker["spec"]["podManagementPolicy"] = "Together"
    del worker["spec"]["selector"]
    assert k8s.validate(worker) == [
        ".spec.selector: required",
        ".spec.podManagementPolicy: 'Together' is not one of ['OrderedReady', 'Parallel']",
        ".spec.template.spec.containers[0].ports[0].containerPort: '9100' is not of type integer",
        ".spec.template.spec.containers[0].livenessProbe.httpGet.paht: unknown field",
    ]
    monitor = copy.deepcopy(one("PodMonitor", "splitbrain-worker"))
    monitor["spec"]["podMetricsEndpoints"][0]["scheme"] = "ftp"
    monitor["spec"]["selectors"] = {}
    assert k8s.validate(monitor) == [
        ".spec.podMetricsEndpoints[0].scheme: 'ftp' is not one of ['http', 'https']",
        ".spec.selectors: unknown field",
    ]
    rule = copy.deepcopy(one("PrometheusRule", "splitbrain"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    (error,) = k8s.validate(rule)
    assert error.startswith(".spec.groups[0].rules[0].for: '5 minutes' does not match")


def test_the_prometheus_rule_is_what_export_writes(tmp_path: Path) -> None:
    """`splitbrain export alerts` is the rules' source: the manifest is its output, unchanged."""
    parser = build_parser()
    args = parser.parse_args(["export", "alerts", str(tmp_path)])
    assert args.run(args) == 0
    exported = tmp_path / "kubernetes" / "splitbrain.prometheusrule.yaml"
    assert (k8s.BASE / "prometheusrule.yaml").read_text() == exported.read_text()


def test_each_container_sets_only_what_its_command_reads_and_passes_only_its_flags() -> None:
    known = settings_variables()
    for obj, spec in workloads():
        for container in k8s.containers(spec):
            where = f"{k8s.name_of(obj)} {container['name']}"
            assert container["image"] == image(), where
            parser, flags = command_parser(container["args"])
            documented = set(SPLITBRAIN_VARIABLE.findall(parser.format_help()))
            for variable in k8s.environment(container, OBJECTS):
                assert variable in known, f"{where}: {variable} is read by no command"
                assert variable in documented, f"{where}: {parser.prog} ignores {variable}"
            try:
                build_parser().parse_args([*container["args"]])
            except SystemExit:
                pytest.fail(f"{where}: splitbrain refuses {container['args']} ({flags})")


def image() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"splitbrain:{version}"


def test_secrets_come_only_from_secret_references() -> None:
    assert not by_kind("Secret"), "the base holds no secret: the operator creates them"
    for config_map in by_kind("ConfigMap"):
        for variable in config_map["data"]:
            assert not SECRET_VARIABLE.search(variable), f"{variable} in a ConfigMap"
    secrets: set[tuple[str, str]] = set()
    for obj, spec in workloads():
        for container in k8s.containers(spec):
            for variable, value in k8s.environment(container, OBJECTS).items():
                if SECRET_VARIABLE.search(variable):
                    assert isinstance(value, dict) and set(value) == {"secretKeyRef"}, (
                        f"{k8s.name_of(obj)}: {variable} is not from a Secret"
                    )
                    secrets.add((value["secretKeyRef"]["name"], value["secretKeyRef"]["key"]))
    # The Secrets docs/operating/kubernetes.md tells the operator to create.
    assert secrets == {
        ("splitbrain-kafka", "sasl-password"),
        ("splitbrain-leases", "dsn"),
        ("splitbrain-pagerduty", "routing-key"),
        ("splitbrain-ui", "token"),
    }
    page = kubernetes_page()
    for name, key in secrets:
        assert f"{name}" in page and f"{key}=" in page, f"the Kubernetes page omits {name}/{key}"


def kubernetes_page() -> str:
    return (ROOT / "docs" / "operating" / "kubernetes.md").read_text()


def test_workers_are_a_stateful_set_whose_pod_names_are_their_instance_ids() -> None:
    """The transactional id is <group>-<instance id>: a pod that comes back under its name fences
    its previous incarnation, and no two live workers share one."""
    (worker,) = by_kind("StatefulSet")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["worker"]
    env = k8s.environment(container, OBJECTS)
    assert env["SPLITBRAIN_INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # The state directory is writable (the root filesystem is not) and starts empty.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    state = Path(str(env["SPLITBRAIN_STATE_DIR"]))
    (mount,) = (p for p in mounts if Path(p) in (state, *state.parents))
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts[mount]]
    assert worker["spec"]["serviceName"] == one("Service", "splitbrain-worker")["metadata"]["name"]
    assert one("Service", "splitbrain-worker")["spec"]["clusterIP"] == "None"
    budget = one("PodDisruptionBudget", "splitbrain-worker")
    assert budget["spec"]["selector"] == worker["spec"]["selector"]
    # Ready (/metrics answers) comes before the restore: a rolling update waits out at least
    # the 20.2 s from a restart to processing again at 10^6 workflows (docs/benchmarks.md,
    # bench_recovery, 2026-12-03) before it stops the next worker.
    assert worker["spec"]["minReadySeconds"] > 20.2


def test_probes_ask_what_each_process_serves() -> None:
    """/metrics on the port the process is told to serve it on, bound beyond loopback; the
    findings view's /healthz for readiness (200 once it read the findings topic to its end)."""
    metrics_port = {
        "worker": "SPLITBRAIN_METRICS_PORT",
        "page": "SPLITBRAIN_PAGE_METRICS_PORT",
        "relay": "--metrics-port",
    }
    seen = set()
    for obj, spec in workloads():
        for container in spec["containers"]:
            if obj["kind"] == "Job":
                continue
            seen.add(container["name"])
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            env = k8s.environment(container, OBJECTS)
            probes = [
                container[p]
                for p in ("livenessProbe", "readinessProbe", "startupProbe")
                if p in container
            ]
            if container["name"] == "ui":
                assert env["SPLITBRAIN_UI_LISTEN"] == f"0.0.0.0:{ports['http']}"
                assert container["readinessProbe"]["httpGet"] == {
                    "path": "/healthz",
                    "port": "http",
                }
                assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
                continue
            source = metrics_port[container["name"]]
            args = container["args"]
            port = args[args.index(source) + 1] if source in args else env[source]
            address = (
                args[args.index("--metrics-address") + 1]
                if source in args
                else env[source.replace("PORT", "ADDRESS")]
            )
            assert int(str(port)) == ports["metrics"] and address == "0.0.0.0"
            assert len(probes) == 3
            for probe in probes:
                assert probe["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert seen == {"worker", "page", "ui", "relay"}


def test_every_pod_runs_unprivileged_on_a_read_only_root() -> None:
    for obj, spec in workloads():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001, k8s.name_of(obj)
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in k8s.containers(spec):
            context = container["securityContext"]
            assert context == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, f"{k8s.name_of(obj)} {container['name']}"
            # Every memory request has a limit, so a leak ends in a restart, not a node's OOM.
            resources = container["resources"]
            assert resources["limits"]["memory"] and resources["requests"]["memory"]


def test_the_pod_monitors_scrape_each_component_under_the_job_the_rules_select() -> None:
    rules = (ROOT / "alerts" / "splitbrain.rules.yml").read_text()
    assert 'up{job="splitbrain"}' in rules
    pods = {
        labels["app.kubernetes.io/component"]: spec
        for obj, spec in workloads()
        if obj["kind"] != "Job"
        for labels in [obj["spec"]["template"]["metadata"]["labels"]]
    }
    jobs = {}
    for monitor in by_kind("PodMonitor"):
        component = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        (container,) = pods[component]["containers"]
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
        (relabel,) = endpoint["relabelings"]
        jobs[component] = relabel["replacement"]
    assert jobs == {
        "worker": "splitbrain",
        "page": "splitbrain-page",
        "relay": "splitbrain-relay",
        "ui": "splitbrain-ui",
    }


def test_the_example_overlay_builds_on_the_base() -> None:
    """kustomize itself is not installed in CI: the overlay is read for what it changes, and each
    name it patches must exist in the base."""
    overlay_dir = k8s.KUSTOMIZE / "overlays" / "example"
    overlay = yaml.safe_load((overlay_dir / "kustomization.yaml").read_text())
    assert (overlay_dir / overlay["resources"][0]).resolve() == k8s.BASE
    names = {o["metadata"]["name"] for o in OBJECTS}
    assert {r["name"] for r in overlay["replicas"]} <= names
    assert {i["name"] for i in overlay["images"]} == {image().split(":")[0]}
    for patch in overlay["patches"]:
        if "path" in patch:
            patched = yaml.safe_load((overlay_dir / patch["path"]).read_text())
            assert patched["metadata"]["name"] in names
            base = one(patched["kind"], patched["metadata"]["name"])
            assert set(patched["data"]) <= set(base["data"])
