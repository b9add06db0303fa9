"""What the stack needs, checked before anything starts: Java 17+, Kafka's jars, the ports
asked for; and which optional programs (Prometheus, Alertmanager, PostgreSQL, the view) this
machine has, each one missing a line that says what to install."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from detector.devstack.errors import UnusableError
from detector.devstack.kafka import JARS_MARKER, DevKafkaError, jars_dir
from detector.devstack.process import port_free
from detector.errors import SplitbrainError

Say = Callable[[str], None]
_JAVA_MAJOR: Final = 17


@dataclass(frozen=True, slots=True)
class Options:
    """What can be chosen about the stack; a port of 0 is a free one."""

    prometheus_port: int = 0
    alertmanager_port: int = 0
    destination_port: int = 0
    detectors: int = 2
    fenced: bool = False  # the example destination enforces the fence (False: the demo's mode)
    brokers: int = 1  # 3 or more: a KRaft cluster, and the topics' default (production) profile
    pager: bool = True
    view: bool = False  # the findings view (`splitbrain ui`), where the pager's pages link


PORT_FLAGS: Final = {
    "prometheus_port": "--prometheus-port",
    "alertmanager_port": "--alertmanager-port",
    "destination_port": "--destination-port",
}


@dataclass(frozen=True, slots=True)
class Skipped:
    """A component that cannot run here, and the one line that says why and what to do."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Tools:
    """The external programs found by `preflight`; None where one is missing."""

    prometheus: str | None
    alertmanager: str | None
    postgres: bool
    pager: bool
    view: bool
    skipped: tuple[Skipped, ...]


def java_major(java: str) -> int | None:
    """The major version `java -version` reports (8 for 1.8), or None if it does not run."""
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


def preflight(options: Options, say: Say) -> Tools:
    """Check what the stack needs before anything starts: Java 17+, Kafka's jars (resolved from
    Maven Central once, then cached), the ports asked for; an `UnusableError` says what to do.
    Find the optional programs; each one missing is a `Skipped` line."""
    java = _java()
    if java is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if os.environ.get("JAVA_HOME")
            else "no java on PATH and JAVA_HOME is unset"
        )
        raise UnusableError(
            f"the Kafka broker needs Java {_JAVA_MAJOR}+ ({where}): install it "
            "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    major = java_major(java)
    if major is None or major < _JAVA_MAJOR:
        raise UnusableError(
            f"the Kafka broker needs Java {_JAVA_MAJOR}+, and {java} is "
            f"{'not runnable' if major is None else f'Java {major}'}: install "
            "openjdk-17-jre-headless or point JAVA_HOME at a JDK 17+"
        )
    for name, flag in PORT_FLAGS.items():
        port = getattr(options, name)
        if port and not port_free(port):
            raise UnusableError(
                f"port {port} on 127.0.0.1 ({flag}) is in use: stop what listens there, or pass "
                f"another port ({flag} 0 picks a free one)"
            )
    if not (jars_dir() / JARS_MARKER).exists():
        if shutil.which("mvn") is None:
            raise UnusableError(
                "Kafka's jars are not cached yet and Maven (mvn) is not on PATH: install it "
                "(apt-get install maven), it fetches them from Maven Central once"
            )
        say(f"resolving Kafka's jars from Maven Central into {jars_dir()} (once)")
    from detector.devstack.kafka import ensure_jars  # noqa: PLC0415

    try:
        ensure_jars()
    except DevKafkaError as exc:
        raise UnusableError(
            f"Kafka's jars could not be resolved from Maven Central: {str(exc).splitlines()[0]}"
            " (check the network and Maven's settings)"
        ) from exc
    skipped: list[Skipped] = []
    root = os.geteuid() == 0
    install = "apt-get install" if root else "as root: apt-get install"
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        skipped.append(
            Skipped(
                "prometheus",
                f"not installed ({install} prometheus): the alerting rules are not evaluated",
            )
        )
    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if alertmanager is None:
        skipped.append(
            Skipped(
                "alertmanager",
                f"not installed ({install} prometheus-alertmanager): nothing can be paged",
            )
        )
    postgres = True
    try:
        from detector.devstack.postgres import postgres_binaries  # noqa: PLC0415

        postgres_binaries()
    except (ImportError, SplitbrainError):
        postgres = False
        skipped.append(
            Skipped(
                "postgres",
                f"not installed ({install} postgresql): no lease store, so no destination, "
                "relay or agents",
            )
        )
    pager = options.pager
    if pager and alertmanager is None:
        pager = False
        skipped.append(Skipped("pager", "it pages through Alertmanager, which is missing"))
    view = options.view and all(
        importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn")
    )
    if options.view and not view:
        skipped.append(
            Skipped("view", "the ui extra is not installed (pip install '.[ui]'): no findings view")
        )
    return Tools(prometheus, alertmanager, postgres, pager, view, tuple(skipped))
