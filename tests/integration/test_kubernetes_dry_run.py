"""The Kubernetes manifests (`deploy/kubernetes/`) against a real kube-apiserver v1.35 (built by
scripts/build-kube-apiserver.sh): every object rendered from the base is server-side applied
with `dryRun=All` and strict field validation, as `kubectl apply --server-side --dry-run=server
-k deploy/kubernetes` would. The Prometheus Operator's CRDs (tests/data/kubernetes-schemas/) are
installed first, for real, so that the PodMonitors and the PrometheusRule are checked by the
server too. The server runs the API's own validation (names, ports, selectors, the CRDs' CEL
rules) that the fast suite's schema check cannot.

Marked `slow`: it needs the built server (skipped, naming the script, when it is not there; a
failure in the slow job, which builds it).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any, Final

import pytest
import yaml

from detector.devstack.kube_apiserver import (
    TOKEN,
    LocalKubeApiServer,
    LocalKubeApiServerError,
    kube_apiserver_binary,
)
from tests import kubernetes_manifests as k8s

pytestmark = pytest.mark.slow

NAMESPACE: Final = "splitbrain"
MANAGER: Final = "splitbrain-tests"
PLURALS: Final = {
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "ConfigMap": "configmaps",
    "Service": "services",
    "StatefulSet": "statefulsets",
    "Deployment": "deployments",
    "Job": "jobs",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "CustomResourceDefinition": "customresourcedefinitions",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
}
CLUSTER_SCOPED: Final = frozenset({"Namespace", "CustomResourceDefinition"})


class Api:
    """Plain HTTPS to the server, with its test token (no kubectl on the machine)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE

    def path(self, obj: Mapping[str, Any]) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        scope = "" if kind in CLUSTER_SCOPED else f"/namespaces/{NAMESPACE}"
        return f"{prefix}{scope}/{PLURALS[kind]}/{obj['metadata']['name']}"

    def request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type},
        )
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool) -> tuple[int, dict[str, Any]]:
        """Server-side apply (`application/apply-patch+yaml`, JSON being YAML), strict."""
        query = f"fieldManager={MANAGER}&fieldValidation=Strict&force=true"
        if dry_run:
            query += "&dryRun=All"
        return self.request(
            "PATCH", f"{self.path(obj)}?{query}", obj, "application/apply-patch+yaml"
        )


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    try:
        kube_apiserver_binary()
    except LocalKubeApiServerError as exc:
        pytest.skip(str(exc))
    with LocalKubeApiServer() as server:
        api = Api(server.url)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        status, body = api.apply(namespace, dry_run=False)
        assert status in (200, 201), body
        for path in sorted(k8s.SCHEMAS.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            status, body = api.apply(crd, dry_run=False)
            assert status in (200, 201), (path.name, body)
            wait_established(api, crd)
        yield api


def wait_established(api: Api, crd: Mapping[str, Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        _, body = api.request("GET", api.path(crd))
        conditions = (body.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        assert time.monotonic() < deadline, f"{crd['metadata']['name']} not established: {body}"
        time.sleep(0.2)


@pytest.mark.parametrize("obj", k8s.render(), ids=k8s.name_of)
def test_the_server_accepts_every_object_in_a_dry_run(api: Api, obj: k8s.Object) -> None:
    status, body = api.apply(obj, dry_run=True)
    assert status in (200, 201), f"{k8s.name_of(obj)}: {status} {body.get('message', body)}"
    assert (body["kind"], body["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
    # What the server defaulted and kept: the object as applied, nothing dropped on the way.
    assert body["metadata"].get("labels", {}) == obj["metadata"].get("labels", {})
    # A dry run stores nothing.
    status, _ = api.request("GET", api.path(obj))
    assert status == 404


def test_the_server_refuses_a_broken_object_so_the_dry_run_proves_something(api: Api) -> None:
    (worker,) = (o for o in k8s.render() if o["kind"] == "StatefulSet")
    broken = json.loads(json.dumps(worker))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = 70000
    status, body = api.apply(broken, dry_run=True)
    assert status == 422, body
    assert "containerPort" in body["message"]
    (monitor,) = (o for o in k8s.render() if k8s.name_of(o) == "PodMonitor/splitbrain-worker")
    broken = json.loads(json.dumps(monitor))
    broken["spec"]["podMetricsEndpoints"][0]["scheme"] = "ftp"
    status, body = api.apply(broken, dry_run=True)
    assert status == 422, body
    assert "scheme" in body["message"]
