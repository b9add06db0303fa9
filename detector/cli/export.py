"""`splitbrain export KIND DIR`: the files the package bundles, written out for a team that keeps
them in its own repository (GitOps) or loads them into its own Prometheus and Grafana.

Prometheus Operator users also get the rules as a `PrometheusRule` (the rules file's groups under
`spec`, its comments kept); the dashboard takes its Prometheus from a `datasource` variable, as
the kubernetes-mixin's do, so it imports into any Grafana without editing.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Annotated, Final

import yaml
from pydantic import BeforeValidator

from detector import bundled
from detector.cli.arguments import argument_type
from detector.errors import ExitCode, InputError
from detector.settings import Form

PROMETHEUS_RULE: Final = PurePosixPath("kubernetes/splitbrain.prometheusrule.yaml")
NAME_LABEL: Final = {"app.kubernetes.io/name": "splitbrain"}
# Kubernetes' label syntax: an optional DNS-subdomain prefix and `/`, a name of at most 63
# characters; a value of at most 63, possibly empty.
_LABEL_NAME: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL: Final = re.compile(
    rf"((?P<prefix>[a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?)/)?{_LABEL_NAME}=(?P<value>({_LABEL_NAME})?)"
)

File = tuple[PurePosixPath, bytes]


def _split_label(text: str) -> tuple[str, str]:
    if _LABEL.fullmatch(text) is None:
        raise ValueError("not a label")
    key, _, value = text.partition("=")
    return key, value


Label = Annotated[
    tuple[str, str],
    BeforeValidator(_split_label),
    Form("KEY=VALUE with a Kubernetes label key and value", "KEY=VALUE"),
]


def prometheus_rule(rules: str, labels: dict[str, str]) -> str:
    """The rules file as a Prometheus Operator `PrometheusRule`: its `groups` under `spec`,
    indented as they are written, comments included."""
    lines = rules.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    head = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "splitbrain", "labels": {**NAME_LABEL, **labels}},
    }
    spec = "\n".join(f"  {line}" if line else "" for line in lines[start:])
    return (
        f"# {bundled.RULES.name} for the Prometheus Operator (`splitbrain export alerts`);\n"
        "# add the labels your Prometheus's ruleSelector matches with --label KEY=VALUE.\n"
        + yaml.safe_dump(head, sort_keys=False)
        + f"spec:\n{spec}\n"
    )


def _bundled(directory: PurePosixPath) -> Iterator[File]:
    for path, node in bundled.walk(directory):
        yield path, node.read_bytes()


def _topics(args: argparse.Namespace) -> Iterator[File]:
    yield PurePosixPath(bundled.TOPICS.name), bundled.resource(bundled.TOPICS).read_bytes()


def _alerts(args: argparse.Namespace) -> Iterator[File]:
    yield from _bundled(bundled.ALERTS)
    rules = bundled.resource(bundled.RULES).read_text(encoding="utf-8")
    yield PROMETHEUS_RULE, prometheus_rule(rules, dict(args.label or ())).encode()


KINDS: Final[dict[str, tuple[str, Callable[[argparse.Namespace], Iterator[File]]]]] = {
    "topics": ("the topics file, for `topics apply --file`", _topics),
    "schemas": (
        "the JSON Schemas of the events, the findings and the pager's state records",
        lambda args: _bundled(bundled.SCHEMAS),
    ),
    "alerts": (
        "the Prometheus rules with their promtool tests, the Alertmanager example, and the "
        f"rules as a PrometheusRule ({PROMETHEUS_RULE})",
        _alerts,
    ),
    "dashboards": (
        "the Grafana dashboard, its Prometheus chosen by its `datasource` variable",
        lambda args: _bundled(bundled.DASHBOARDS),
    ),
    "examples": (
        "the example histories, for `splitbrain audit`",
        lambda args: _bundled(bundled.EXAMPLES),
    ),
}


def run(args: argparse.Namespace) -> int:
    if args.label and args.kind != "alerts":
        raise InputError("--label labels the PrometheusRule of `alerts`")
    _, files = KINDS[args.kind]
    for name, content in files(args):
        target = args.dir / Path(*name.parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except OSError as exc:
            raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
        print(target)
    return ExitCode.OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "export",
        help="write the bundled topics file, schemas, alerts or dashboards into a directory",
        description="Write the files the package bundles into DIR (created if missing), for "
        "your own repository or monitoring: "
        + "; ".join(f"{kind}: {what}" for kind, (what, _) in KINDS.items())
        + ". Files of the same name are overwritten, others left alone; each path written is "
        "printed. Exit 0: written; 2: DIR cannot be written.",
    )
    p.add_argument("kind", choices=KINDS, help="what to write")
    p.add_argument("dir", type=Path, metavar="DIR", help="where to write it")
    p.add_argument(
        "--label",
        type=argument_type(Label),
        action="append",
        metavar="KEY=VALUE",
        help="alerts: a label of the PrometheusRule, e.g. the one your Prometheus's "
        "ruleSelector matches (repeatable)",
    )
    p.set_defaults(run=run)
