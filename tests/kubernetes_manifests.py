"""The Kubernetes manifests of `deploy/kubernetes/` as the tests read them: rendered as kustomize
renders a base of plain resources, and checked against the schemas a real kube-apiserver and the
Prometheus Operator's CRDs give (`tests/data/kubernetes-schemas/`, written by
`scripts/kube_schemas.py`).

The base uses only `resources:` (files and directories of other such kustomizations), so the
rendering is the files' documents in the listed order; a kustomization with anything else is
refused here rather than rendered wrongly.

The check is the API server's strict field validation, offline: every field must be one the
schema names (an unknown or misspelt field is an error, as `kubectl apply --validate=strict`
makes it), of its type, with its required fields and enum values; CRDs also get their patterns,
lengths and bounds. Not checked offline: CEL rules (`x-kubernetes-validations`) and the API's
own validation code (a DNS-1123 name, a port range), which the slow job's server-side dry run
covers (tests/integration/test_kubernetes_dry_run.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

import yaml

from tests.paths import ROOT

KUSTOMIZE: Final = ROOT / "deploy" / "kubernetes"
BASE: Final = KUSTOMIZE / "base"
SCHEMAS: Final = ROOT / "tests" / "data" / "kubernetes-schemas"
PLAIN_KUSTOMIZATION: Final = frozenset({"apiVersion", "kind", "resources"})
Object = dict[str, Any]


class ManifestError(AssertionError):
    """A manifest that does not render, or an object its schema refuses."""


def render(directory: Path = KUSTOMIZE) -> list[Object]:
    """The objects `kustomize build directory` writes for a base of plain resources."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    extra = set(kustomization) - PLAIN_KUSTOMIZATION
    if extra:
        raise ManifestError(f"{directory}: not a plain list of resources: {sorted(extra)}")
    objects: list[Object] = []
    for entry in kustomization["resources"]:
        path = directory / entry
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return objects


def name_of(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


# ---- the schemas ------------------------------------------------------------------------------


@cache
def openapi() -> dict[str, Any]:
    """`kinds` (apiVersion/kind to a schema's name) and `schemas`, from the API server."""
    document: dict[str, Any] = json.loads((SCHEMAS / "openapi.json").read_text())
    return document


@cache
def crds() -> dict[str, Any]:
    """apiVersion/kind to the CRD's openAPIV3Schema, for each CRD file of SCHEMAS."""
    found: dict[str, Any] = {}
    for path in sorted(SCHEMAS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = f"{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['kind']}"
            found[key] = version["schema"]["openAPIV3Schema"]
    return found


def schema_for(obj: Mapping[str, Any]) -> tuple[Object, bool]:
    """The object's schema, and whether it is a CRD's (which declares its own constraints)."""
    key = f"{obj.get('apiVersion')}/{obj.get('kind')}"
    if key in openapi()["kinds"]:
        return {"$ref": f"#/components/schemas/{openapi()['kinds'][key]}"}, False
    if key in crds():
        return crds()[key], True
    raise ManifestError(f"{key}: no schema for this kind in {SCHEMAS.relative_to(ROOT)}")


def validate(obj: Mapping[str, Any]) -> list[str]:
    """Every way the object departs from its kind's schema, as `path: problem`."""
    schema, is_crd = schema_for(obj)
    errors = list(_errors(obj, schema, "", crd=is_crd))
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        errors.append(".metadata.name: required")
    return errors


def _resolve(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema or ("allOf" in schema and len(schema["allOf"]) == 1):
        if "$ref" in schema:
            schema = openapi()["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        else:
            schema = {**{k: v for k, v in schema.items() if k != "allOf"}, **schema["allOf"][0]}
    return schema


_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _is(value: object, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


def _errors(value: object, schema: Mapping[str, Any], path: str, *, crd: bool) -> Iterator[str]:
    schema = _resolve(schema)
    where = path or "."
    if value is None and schema.get("nullable"):
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (_is(value, "integer") or _is(value, "string")):
            yield f"{where}: {value!r} is neither an integer nor a string"
        return
    for keyword, needed in (("oneOf", 1), ("anyOf", None)):
        if keyword in schema:
            matching = sum(not any(_errors(value, s, path, crd=crd)) for s in schema[keyword])
            if (needed is None and matching == 0) or (needed is not None and matching != needed):
                yield f"{where}: {value!r} matches {matching} of its {keyword} alternatives"
    kind = schema.get("type")
    if kind is not None and not _is(value, kind):
        yield f"{where}: {value!r} is not of type {kind}"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{where}: {value!r} is not one of {schema['enum']}"
    if crd:
        yield from _constraints(value, schema, where)
    if isinstance(value, dict):
        yield from _object_errors(value, schema, path, crd=crd)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _errors(item, schema["items"], f"{path}[{index}]", crd=crd)


def _object_errors(
    value: Mapping[str, Any], schema: Mapping[str, Any], path: str, *, crd: bool
) -> Iterator[str]:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            yield f"{path}.{name}: required"
    extra = schema.get("additionalProperties")
    open_ended = schema.get("x-kubernetes-preserve-unknown-fields") or (
        not properties and extra is None
    )
    for name, item in value.items():
        if name in properties:
            yield from _errors(item, properties[name], f"{path}.{name}", crd=crd)
        elif isinstance(extra, Mapping):
            yield from _errors(item, extra, f"{path}.{name}", crd=crd)
        elif not (open_ended or extra is True):
            yield f"{path}.{name}: unknown field"


def _constraints(value: object, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{where}: {value!r} does not match {schema['pattern']!r}"
        if len(value) < schema.get("minLength", 0):
            yield f"{where}: {value!r} is shorter than {schema['minLength']}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{where}: {value!r} is longer than {schema['maxLength']}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{where}: {value!r} is below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{where}: {value!r} is above {schema['maximum']}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            yield f"{where}: fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield f"{where}: more than {schema['maxItems']} items"


# ---- what the objects hold --------------------------------------------------------------------


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template's spec of a workload, or None for an object that runs no pod."""
    if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
        spec: Mapping[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    return None


def containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*spec.get("initContainers", ()), *spec["containers"]]


def environment(container: Mapping[str, Any], objects: list[Object]) -> dict[str, object]:
    """A container's variables: its ConfigMaps' values (envFrom, from the rendered objects)
    overridden by its `env` entries (a value, or the `valueFrom` mapping)."""
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    found: dict[str, object] = {}
    for source in container.get("envFrom", ()):
        if "configMapRef" in source:
            found.update(config_maps[source["configMapRef"]["name"]].get("data", {}))
        else:
            raise ManifestError(f"{container['name']}: envFrom {source}: only ConfigMaps")
    for entry in container.get("env", ()):
        found[entry["name"]] = entry["valueFrom"] if "valueFrom" in entry else entry["value"]
    return found
