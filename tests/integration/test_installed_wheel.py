"""The package as a new user gets it: the sdist and wheel `python -m build` makes (and `twine
check` passes), the wheel installed by pip into a fresh virtual environment with no compiler,
Java or Maven on PATH, and its commands run from an empty directory, far from any checkout:
`--version`, `topics apply --dry-run` against a real broker, `export` of each kind (checked by
promtool and amtool), `audit` of a bundled example (and its HTML report), and the live demo to
exit 0.

pip reaches PyPI for the dependencies, at the versions of constraints.txt, through its cache."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from detector.devstack.kafka import LocalKafka
from detector.devstack.worker import connection_env
from tests.exported import KINDS, check_export
from tests.integration.test_demo import RUN_TIMEOUT_S, left_running, require_stack_tools
from tests.paths import ROOT

# What the wheel is built from: what the image copies too (Dockerfile).
BUILT_FROM: Final = ("pyproject.toml", "README.md", "detector")
TEST_ONLY: Final = ("pytest", "hypothesis", "cryptography", "matplotlib", "detector.testing")
# The modules that need an extra (faust, an adapter's system), and the scenarios built on them.
OF_AN_EXTRA: Final = (
    "detector.runtime.faust",
    *(
        f"detector.adapters.{m}"
        for m in ("temporal", "celery", "langgraph", "etcd", "kubernetes", "redis_lock")
    ),
    "detector.adapters._etcd_watch",
    "detector.adapters._kube_watch",
    "detector.devstack.temporal",
    *(f"detector.demos.{m}" for m in ("celery_app", "langgraph_graph", "kube_candidate")),
    "detector.view.app",
)
# Every module of the package, imported as a command would: those of an extra left out.
IMPORT_ALL: Final = f"""
import importlib, pathlib, detector
top = pathlib.Path(detector.__file__).parent
for path in sorted(top.rglob("*.py")):
    name = ".".join(("detector", *path.relative_to(top).with_suffix("").parts))
    name = name.removesuffix(".__init__")
    if not name.endswith("__main__") and not name.startswith({OF_AN_EXTRA!r}):
        importlib.import_module(name)
print(detector.__file__)
"""


def run(argv: list[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Installed:
    bin: Path
    home: Path  # the empty working directory the commands run in

    def env(self, config: Mapping[str, object] | None = None) -> dict[str, str]:
        """No PYTHONPATH (the checkout stays out of sight); the venv first on PATH."""
        env = connection_env(config or {})
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    def splitbrain(self, *args: str | Path, config: Mapping[str, object] | None = None) -> str:
        return run([self.bin / "splitbrain", *args], cwd=self.home, env=self.env(config))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    source, dist, venv, home = (work / name for name in ("source", "dist", "venv", "home"))
    source.mkdir()
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    # The sdist, then the wheel built from it: what the sdist lacks, the wheel lacks too.
    run([sys.executable, "-m", "build", "--outdir", dist, source])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel])
    run([sys.executable, "-m", "venv", venv])
    # Binary wheels only, and nothing but the venv on PATH: no compiler, Java or Maven is used.
    pip_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip_env |= {"PATH": str(venv / "bin"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip: list[str | Path] = [venv / "bin" / "pip", "install", "-q", "--only-binary=:all:"]
    run([*pip, "-c", ROOT / "constraints.txt", wheel], env=pip_env)
    home.mkdir()
    return Installed(venv / "bin", home)


def test_version_names_the_package_and_the_formats(installed: Installed) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = installed.splitbrain("--version").splitlines()
    assert lines[0] == f"splitbrain-detector {project['version']}"
    assert "events: splitbrain.ownership/v1" in lines
    assert "findings: splitbrain.finding/v1" in lines
    assert any(re.fullmatch(r"workflow state: v\d+", line) for line in lines), lines


def test_every_module_imports_without_a_test_only_package(installed: Installed) -> None:
    python = installed.bin / "python"
    where = run([python, "-c", IMPORT_ALL], cwd=installed.home, env=installed.env())
    assert Path(where.strip()).is_relative_to(installed.bin.parent), "the checkout was imported"
    for name in TEST_ONLY:
        script = f"import importlib.util as u; print(u.find_spec({name!r}))"
        found = run([python, "-c", script], cwd=installed.home, env=installed.env())
        assert found.strip() == "None", f"{name} is installed with the package"


def test_the_wheel_ships_the_kube_apiserver_build_and_names_how_to_run_it(
    installed: Installed, tmp_path: Path
) -> None:
    """`demo --source kubernetes` without a server names a command that works from the wheel
    (issue 34: it named `scripts/`, which the wheel does not ship)."""
    python = installed.bin / "python"
    script = (
        "from detector.devstack.kube_apiserver import BUILD_SCRIPT, kube_apiserver_binary\n"
        "assert BUILD_SCRIPT.is_file(), BUILD_SCRIPT\n"
        "try:\n    kube_apiserver_binary()\n"
        "except Exception as exc:\n    print(exc)\n"
    )
    env = {**installed.env(), "SPLITBRAIN_CACHE": str(tmp_path / "empty-cache")}
    said = run([python, "-c", script], cwd=installed.home, env=env).strip()
    assert said.startswith("kube-apiserver is not built: run `python -m detector.devstack."), said
    assert "scripts/" not in said


def test_topics_apply_dry_run_reads_the_bundled_topics(
    installed: Installed, kafka_broker: LocalKafka
) -> None:
    args = ("topics", "apply", "--dry-run", "--profile", "local")
    out = installed.splitbrain(*args, config=kafka_broker.client_config())
    assert re.search(r"^(dry run: \d+ topic\(s\) to create|no changes)", out, re.M), out


@pytest.mark.parametrize("kind", KINDS)
def test_export_writes_what_the_tools_accept(installed: Installed, kind: str) -> None:
    out = installed.home / "exported" / kind
    installed.splitbrain("export", kind, out.relative_to(installed.home))
    check_export(kind, out)


def test_audit_of_a_bundled_example(installed: Installed) -> None:
    installed.splitbrain("export", "examples", "examples")
    examples = installed.home / "examples"
    out = installed.splitbrain(
        "audit",
        examples / "export-ledger.jsonl",
        "--expect",
        examples / "export-ledger.expected.json",
        "--fail-on",
        "none",
        "--html",
        "report.html",
    )
    assert out.rstrip().endswith("PASS"), out
    # The report's templates are package data: the wheel carries them.
    assert '<g class="lane"' in (installed.home / "report.html").read_text()


def test_the_demo_pages_from_an_empty_directory(installed: Installed) -> None:
    require_stack_tools()
    demo = subprocess.Popen(
        [installed.bin / "splitbrain", "demo", "--non-interactive"],
        cwd=installed.home,
        env=installed.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = demo.communicate(timeout=RUN_TIMEOUT_S + 300)  # + Kafka's jars, once
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGINT)  # the demo stops what it started
        out, _ = demo.communicate(timeout=90)
        pytest.fail(f"the demo did not end:\n{out}")
    assert demo.returncode == 0, out
    assert "PAGED: the critical finding reached Alertmanager" in out, out
    assert left_running(installed.home / "var" / "demo", out) == []
