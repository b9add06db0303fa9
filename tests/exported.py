"""What a user of `splitbrain export KIND DIR` relies on, checked on the files it wrote: the
repository's own files, byte for byte, that Prometheus, Alertmanager, the Prometheus Operator and
Grafana accept. Shared by the command's unit test and the installed wheel's test."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Final

import yaml

from detector.contracts import schemas
from detector.kafka.admin import load_topics
from tests.paths import ROOT
from tests.tools import program

KINDS: Final = ("topics", "schemas", "alerts", "dashboards", "examples")
PROMETHEUS_RULE: Final = Path("kubernetes", "splitbrain.prometheusrule.yaml")
_SOURCES: Final = {
    "topics": (ROOT / "topics", "topics.yaml"),
    "schemas": (ROOT / "topics" / "schemas", "*"),
    "alerts": (ROOT / "alerts", "**/*"),
    "dashboards": (ROOT / "dashboards", "**/*"),
    "examples": (ROOT / "examples", "**/*"),
}


def _files(directory: Path, pattern: str) -> dict[Path, bytes]:
    return {
        path.relative_to(directory): path.read_bytes()
        for path in directory.glob(pattern)
        if path.is_file()
    }


def _tool(*argv: str | Path, cwd: Path) -> None:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{' '.join(map(str, argv))}:\n{done.stdout}{done.stderr}"


def check_export(kind: str, out: Path) -> None:
    source, pattern = _SOURCES[kind]
    written = _files(out, "**/*")
    if kind == "alerts":
        manifest = yaml.safe_load(written.pop(PROMETHEUS_RULE))
    assert written == _files(source, pattern), f"export {kind}: not the repository's files"
    if kind == "topics":
        assert load_topics(out / "topics.yaml", "local")
    elif kind == "schemas":
        for name in schemas.SCHEMAS:
            assert json.loads(written[Path(name)]) == json.loads(schemas.render(name))
    elif kind == "dashboards":
        (board,) = (json.loads(content) for content in written.values())
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert "__inputs" not in board, "a dashboard with __inputs imports only through the UI"
    elif kind == "alerts":
        promtool = program("promtool", package="prometheus")
        amtool = program("amtool", package="prometheus-alertmanager")
        _tool(promtool, "check", "rules", "splitbrain.rules.yml", cwd=out)
        _tool(promtool, "test", "rules", Path("tests", "splitbrain.rules.test.yml"), cwd=out)
        _tool(amtool, "check-config", "alertmanager.example.yml", cwd=out)
        assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
        assert manifest["kind"] == "PrometheusRule"
        assert manifest["metadata"]["name"] == "splitbrain"
        rules = yaml.safe_load(written[Path("splitbrain.rules.yml")])
        assert manifest["spec"] == rules, "the PrometheusRule's groups are not the rules file's"
