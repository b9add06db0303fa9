"""Write the schemas the fast suite validates deploy/kubernetes/ against, into
tests/data/kubernetes-schemas/ (tests/unit/test_kubernetes_manifests.py reads them).

- `openapi.json`: the OpenAPI v3 schemas of the kinds the manifests use, as a real
  kube-apiserver serves them on /openapi/v3/<group-version> (the one `python -m
  detector.devstack.kube_apiserver` builds; started here with its etcd), trimmed to what those
  kinds reach and without descriptions.
- the Prometheus Operator's CRDs for PodMonitor and PrometheusRule, copied from the
  `example/prometheus-operator-crd/` directory of its Go module (`go mod download`), whose
  version is given as the argument, e.g. v0.85.0.

    python scripts/kube_schemas.py v0.85.0
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Final

from detector.devstack.kube_apiserver import TOKEN, LocalKubeApiServer

OUT: Final = Path(__file__).resolve().parents[1] / "tests" / "data" / "kubernetes-schemas"
# group-version path -> the kinds of it the manifests use (tests/kubernetes_manifests.py: KINDS).
GROUPS: Final = {
    "api/v1": ("ConfigMap", "Service", "ServiceAccount", "Secret", "Namespace"),
    "apis/apps/v1": ("Deployment", "StatefulSet"),
    "apis/batch/v1": ("Job",),
    "apis/policy/v1": ("PodDisruptionBudget",),
}
CRDS: Final = ("podmonitors", "prometheusrules")
MODULE: Final = "github.com/prometheus-operator/prometheus-operator"


def fetch(url: str) -> dict[str, Any]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=60, context=context) as resp:
        document: dict[str, Any] = json.load(resp)
    return document


def refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def without_descriptions(node: object) -> object:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def trimmed(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    roots: dict[str, str] = {}
    for path, document in documents.items():
        for name, schema in document["components"]["schemas"].items():
            schemas.setdefault(name, schema)
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                if path.endswith(api_version) and gvk["kind"] in GROUPS[path]:
                    roots[f"{api_version}/{gvk['kind']}"] = name
    kept: set[str] = set()
    todo = set(roots.values())
    while todo:
        name = todo.pop()
        kept.add(name)
        todo |= refs(schemas[name]) - kept
    return {
        "kinds": dict(sorted(roots.items())),
        "schemas": {name: without_descriptions(schemas[name]) for name in sorted(kept)},
    }


def main(version: str) -> int:
    with LocalKubeApiServer() as server:
        documents = {path: fetch(f"{server.url}/openapi/v3/{path}") for path in GROUPS}
        info = fetch(f"{server.url}/version")
    document = {"source": f"kube-apiserver {info['major']}.{info['minor']}", **trimmed(documents)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "openapi.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    downloaded = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        capture_output=True,
        text=True,
        check=True,
    )
    crds = Path(json.loads(downloaded.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    for plural in CRDS:
        name = f"monitoring.coreos.com_{plural}.yaml"
        shutil.copyfile(crds / name, OUT / name)
        (OUT / name).chmod(0o644)
    (OUT / "prometheus-operator.version").write_text(f"{MODULE} {version}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
