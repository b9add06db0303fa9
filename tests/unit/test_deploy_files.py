"""docker-compose.yml, the Dockerfile and deploy/, checked statically: no container runs here.

What a `docker compose up` would trip over, found without a daemon: the compose file is one that
Debian's `docker-compose config` accepts (with deploy/example.env); every file it mounts exists;
every image is pinned; each service sets only `SPLITBRAIN_*` variables that its command reads
(derived from the code: the settings classes and each command's `--help`) and passes only flags
its command has; every long-running service has a healthcheck and every dependency a condition;
no two services publish one host port; Prometheus loads the rules of alerts/ at the same relative
path in the repository and in its container and passes `promtool check config`, scraping the
workers where they serve; Alertmanager's configuration passes `amtool check-config` and routes
each severity; Grafana's provisioning reaches dashboards/ through its mount; secrets come only
from the uncommitted .env, which deploy/example.env documents; and the Dockerfile is multi-stage,
pinned, unprivileged, with `splitbrain` as entrypoint and a healthcheck.

docker-compose, promtool and amtool come from Debian's packages (`.ci/run` installs them); without
one, its test skips, unless SPLITBRAIN_REQUIRE_TOOLS=1 (`tests/conftest.py`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final

import pytest
import yaml

from detector.cli.main import build_parser
from detector.cli.reference import settings_variables
from detector.leases.policy import JobClass
from detector.settings import ENV_PREFIX
from tests.paths import ROOT

COMPOSE: Final = ROOT / "docker-compose.yml"
EXAMPLE_ENV: Final = ROOT / "deploy" / "example.env"
DOCKERFILE: Final = ROOT / "Dockerfile"
DOCKERIGNORE: Final = ROOT / ".dockerignore"
GITIGNORE: Final = ROOT / ".gitignore"
PROMETHEUS: Final = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTMANAGER: Final = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ALERTMANAGER_ENTRYPOINT: Final = ROOT / "deploy" / "alertmanager" / "entrypoint.sh"
GRAFANA_PROVISIONING: Final = ROOT / "deploy" / "grafana" / "provisioning"
RULES: Final = ROOT / "alerts" / "splitbrain.rules.yml"
DASHBOARDS: Final = ROOT / "dashboards"
POM: Final = ROOT / "detector" / "devstack" / "pom.xml"

VERSION_TAG: Final = re.compile(r"v?\d+(\.\d+)+(-[A-Za-z0-9][A-Za-z0-9._-]*)?")
DIGEST: Final = re.compile(r"@sha256:[0-9a-f]{64}$")
SPLITBRAIN_VARIABLE: Final = re.compile(rf"\b{ENV_PREFIX}[A-Z0-9_]*[A-Z0-9]\b")
SECRET_NAME: Final = re.compile(r"PASSWORD|SECRET|TOKEN|ROUTING_KEY|API_KEY")
JOB: Final = "service_completed_successfully"
HEALTHY: Final = "service_healthy"
LOOPBACK: Final = "127.0.0.1"


# ---- the compose file as compose reads it -----------------------------------------------------


def read_env_file(path: Path) -> dict[str, str]:
    """`NAME=value` lines; blank lines and `#` comments skipped (compose's env file format)."""
    out: dict[str, str] = {}
    for number, text in enumerate(path.read_text().splitlines(), 1):
        line = text.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"{path}:{number}: {line}"
        out[name] = value
    return out


_REFERENCE: Final = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)
_BRACED: Final = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>.*))?", re.S)


def interpolate(text: str, env: Mapping[str, str], used: set[str] | None = None) -> str:
    """Compose's `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`,
    `${NAME?error}` and `$$`; `used` collects each name read. A variable that is unset and has
    no default fails the test: compose would only warn, and substitute nothing."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        braced = match["braced"]
        parsed = _BRACED.fullmatch(braced if braced is not None else match["named"])
        assert parsed is not None, f"cannot read {match[0]!r}"
        name, op, arg = parsed["name"], parsed["op"], parsed["arg"]
        if used is not None:
            used.add(name)
        value = env.get(name)
        if value is not None and (value or not op or not op.startswith(":")):
            return value
        if op in (":-", "-"):
            return interpolate(arg, env, used)
        pytest.fail(f"{match[0]}: {name} is not set ({arg or 'no default'})")

    return _REFERENCE.sub(replace, text)


def interpolated(node: Any, env: Mapping[str, str], used: set[str] | None = None) -> Any:
    """Every string value of a parsed YAML document interpolated (keys are not, as in compose)."""
    if isinstance(node, str):
        return interpolate(node, env, used)
    if isinstance(node, list):
        return [interpolated(item, env, used) for item in node]
    if isinstance(node, dict):
        return {key: interpolated(value, env, used) for key, value in node.items()}
    return node


@functools.cache
def raw_compose() -> dict[str, Any]:
    """The compose file as YAML reads it (anchors and merge keys resolved), not interpolated."""
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


@functools.cache
def compose_variables() -> frozenset[str]:
    """Each variable the compose file interpolates."""
    used: set[str] = set()
    interpolated(raw_compose(), read_env_file(EXAMPLE_ENV), used)
    return frozenset(used)


@functools.cache
def compose() -> dict[str, Any]:
    """The compose file as `docker compose --env-file deploy/example.env` sees it."""
    doc = interpolated(raw_compose(), read_env_file(EXAMPLE_ENV))
    assert isinstance(doc, dict)
    return doc


def services() -> dict[str, dict[str, Any]]:
    found = compose()["services"]
    assert isinstance(found, dict)
    return found


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's `environment`, mapping or `NAME=value` list, with values as compose passes
    them (numbers as text)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {name: "" if value is None else str(value) for name, value in env.items()}


def words(value: Any) -> list[str]:
    """An `entrypoint` or `command`: a list, or a string split as compose splits it."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(item) for item in value]


# ---- the Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            continue  # a comment, or a directive: also inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            instruction, _, arguments = full.partition(" ")
            out.append((instruction.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends in a continuation"
    return out


def dockerfile_stages() -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """(base image, stage name, instructions) per `FROM`."""
    stages: list[tuple[str, str | None, list[tuple[str, str]]]] = []
    for instruction, arguments in dockerfile_instructions():
        if instruction == "FROM":
            parts = [p for p in arguments.split() if not p.startswith("--platform")]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append((parts[0], name, []))
        else:
            assert stages, f"{instruction} before the first FROM"
            stages[-1][2].append((instruction, arguments))
    return stages


def image_exec_form(instruction: str) -> list[str]:
    """The final stage's ENTRYPOINT or CMD, which must be in exec (JSON) form."""
    *_, (_, _, final) = dockerfile_stages()
    values = [arguments for name, arguments in final if name == instruction]
    assert values, f"the final stage has no {instruction}"
    parsed = json.loads(values[-1])
    assert isinstance(parsed, list), f"{instruction} is not in exec form: {values[-1]}"
    return [str(word) for word in parsed]


def own_image() -> str:
    """The tag docker-compose.yml builds the Dockerfile under: splitbrain:<project version>."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return f"splitbrain:{project['version']}"


def command_of(service: Mapping[str, Any]) -> list[str]:
    """What the container runs: the entrypoint (the service's, or the image's), then the command
    (the service's, or the image's CMD unless the service overrides the entrypoint)."""
    entrypoint, command = words(service.get("entrypoint")), words(service.get("command"))
    if service.get("image") == own_image() and not entrypoint:
        entrypoint = image_exec_form("ENTRYPOINT")
        command = command or image_exec_form("CMD")
    return entrypoint + command


# ---- mounts -----------------------------------------------------------------------------------


def bind_mounts(service: Mapping[str, Any]) -> list[tuple[Path, PurePosixPath]]:
    """(host path, container path) of each bind mount; named volumes are left out."""
    out: list[tuple[Path, PurePosixPath]] = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, _, rest = volume.partition(":")
            target = rest.partition(":")[0]
            if not source.startswith((".", "/", "~")):
                continue  # a named volume
        elif volume.get("type") == "bind":
            source, target = volume["source"], volume["target"]
        else:
            continue
        out.append(((ROOT / source).resolve(), PurePosixPath(target)))
    return out


def host_path(service: Mapping[str, Any], container: PurePosixPath) -> Path | None:
    """Where a container path comes from, through the service's bind mounts (the deepest)."""
    best: tuple[Path, PurePosixPath] | None = None
    for source, target in bind_mounts(service):
        inside = container == target or target in container.parents
        if inside and (best is None or len(target.parts) > len(best[1].parts)):
            best = (source, target)
    if best is None:
        return None
    return best[0].joinpath(*container.relative_to(best[1]).parts)


def flag_value(argv: list[str], flag: str) -> str:
    for i, word in enumerate(argv):
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
        if word == flag:
            return argv[i + 1]
    pytest.fail(f"no {flag} in {argv}")


# ---- what the code reads ----------------------------------------------------------------------


def _wide(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=200)  # no variable name wrapped


@functools.cache
def help_of(command: tuple[str, ...]) -> str:
    """The `--help` of a service's command: of the `splitbrain` subcommand its words name, built
    here; or of `python -m MODULE` or `python SCRIPT` (a mounted script, given as its path in the
    repository), run from the repository."""
    if command[0] == "splitbrain":
        parser = build_parser()
        for word in command[1:]:
            (actions,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            assert word in actions.choices, f"splitbrain has no command {' '.join(command)}"
            parser = actions.choices[word]
        parser.formatter_class = _wide
        return parser.format_help()
    assert command[0] == "python", f"not a Python command: {command}"
    done = subprocess.run(
        [sys.executable, *command[1:], "--help"],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(command)} --help: {done.stderr}"
    return done.stdout


def program_words(name: str, service: Mapping[str, Any]) -> tuple[tuple[str, ...], list[str]]:
    """A service's program (`splitbrain` and its subcommand words, `python -m MODULE` or `python
    SCRIPT` with the script's repository path) and the arguments that follow it."""
    argv = command_of(service)
    if argv[0] == "splitbrain":
        n = 1
        while n < len(argv) and not argv[n].startswith("-"):
            n += 1
        return tuple(argv[:n]), argv[n:]
    assert argv[0] == "python", f"{name}: runs {argv[0]}, neither splitbrain nor python"
    if argv[1] == "-m":
        return tuple(argv[:3]), argv[3:]
    script = host_path(service, PurePosixPath(argv[1]))
    assert script is not None and script.is_file(), f"{name}: {argv[1]} is not mounted"
    return ("python", str(script)), argv[2:]


def splitbrain_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if s.get("image") == own_image()}


# ---- the tests --------------------------------------------------------------------------------


def test_docker_compose_config_accepts_the_file(docker_compose: str) -> None:
    # The shell's own values would win over the env file's: leave them out.
    env = {k: v for k, v in os.environ.items() if k not in compose_variables()}
    done = subprocess.run(
        [
            docker_compose,
            "--env-file",
            str(EXAMPLE_ENV),
            "--project-directory",
            str(ROOT),
            "--file",
            str(COMPOSE),
            "config",
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_bind_mount_and_the_build_context_exist_in_the_repository() -> None:
    declared = set(compose().get("volumes") or {})
    for name, service in services().items():
        for source, target in bind_mounts(service):
            assert source.exists(), f"{name}: mounts {source} at {target}, which does not exist"
            assert ROOT in (source, *source.parents), f"{name}: mounts {source}, outside the repo"
        for volume in service.get("volumes") or []:
            if isinstance(volume, str) and not volume.startswith((".", "/", "~")):
                assert volume.partition(":")[0] in declared, f"{name}: undeclared volume {volume}"
        build = service.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
            assert (context / (dockerfile or "Dockerfile")).is_file(), f"{name}: {build}"
            assert service.get("image") == own_image(), f"{name}: builds, but not {own_image()}"


def test_every_image_is_pinned() -> None:
    for name, service in services().items():
        image = service.get("image")
        assert image, f"{name}: no image"
        if DIGEST.search(image):
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert VERSION_TAG.fullmatch(tag), f"{name}: {image} is not pinned to a version"
    # The broker the tests run (detector/devstack/pom.xml) is the one the compose file runs.
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    kafka = next(
        d.findtext("m:version", namespaces=namespace)
        for d in ET.parse(POM).getroot().iterfind(".//m:dependency", namespace)
        if d.findtext("m:artifactId", namespaces=namespace) == "kafka_2.13"
    )
    assert services()["kafka"]["image"] == f"apache/kafka:{kafka}"


def test_every_splitbrain_variable_is_one_the_cli_reads() -> None:
    known = settings_variables()
    assert {"SPLITBRAIN_BOOTSTRAP_SERVERS", "SPLITBRAIN_LEASES_DSN"} <= known
    for name, service in services().items():
        for variable in environment(service):
            if variable.startswith(ENV_PREFIX):
                assert variable in known, f"{name}: sets {variable}, which no command reads"


def test_each_service_sets_only_what_its_command_reads_and_passes_only_its_flags() -> None:
    """Per command, what its `--help` names: a worker variable set on the pager bridge (which
    reads SPLITBRAIN_PAGE_...) would be ignored, silently, and so would a misspelt flag."""
    for name, service in splitbrain_services().items():
        command, arguments = program_words(name, service)
        text = help_of(command)
        documented = set(SPLITBRAIN_VARIABLE.findall(text))
        for variable in environment(service):
            if variable.startswith(ENV_PREFIX):
                assert variable in documented, f"{name}: {' '.join(command)} ignores {variable}"
        for argument in arguments:
            if argument.startswith("--"):
                flag = argument.partition("=")[0]
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                    f"{name}: {' '.join(command)} has no {flag}"
                )
        if command[0] == "splitbrain":
            try:
                build_parser().parse_args([*command[1:], *arguments])
            except SystemExit:
                pytest.fail(f"{name}: splitbrain refuses {[*command[1:], *arguments]}")


def test_long_running_services_have_healthchecks_and_dependencies_have_conditions() -> None:
    jobs = {
        target
        for service in services().values()
        for target, how in (service.get("depends_on") or {}).items()
        if isinstance(how, dict) and how.get("condition") == JOB
    }
    for name, service in services().items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on without conditions"
        for target, how in depends.items():
            assert target in services(), f"{name}: depends on unknown {target}"
            condition = how.get("condition")
            wanted = JOB if target in jobs else HEALTHY
            assert condition == wanted, f"{name}: depends on {target} with {condition}"
        check = service.get("healthcheck")
        if name in jobs:
            assert service.get("restart", "no") == "no", f"{name}: a job that restarts"
            continue
        assert check and not check.get("disable"), f"{name}: a long-running service, no check"
        test = words(check.get("test"))
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck {test}"
        assert service.get("restart") in ("always", "unless-stopped"), f"{name}: no restart"
        # What the check reads, the service sets.
        env = environment(service)
        for variable in SPLITBRAIN_VARIABLE.findall(" ".join(test)):
            assert variable in env, f"{name}: its healthcheck reads {variable}, which is not set"


def test_services_reach_each_other_by_service_name() -> None:
    url = re.compile(r"https?://([A-Za-z0-9_.-]+)(?::\d+)?")
    for name, service in services().items():
        for text in [*environment(service).values(), *words(service.get("command"))]:
            for host in url.findall(text):
                if host not in ("localhost", LOOPBACK) and not host.endswith(".invalid"):
                    assert host in services(), f"{name}: {text} names no service"


def published_ports() -> Iterator[tuple[str, str, int, str]]:
    """(service, host address, host port, protocol) of each published port."""
    for name, service in services().items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                address = str(port.get("host_ip", "0.0.0.0"))
                published, protocol = port.get("published"), str(port.get("protocol", "tcp"))
            else:
                spec, _, protocol = str(port).partition("/")
                parts = spec.rsplit(":", 2)
                address = parts[0] if len(parts) == 3 else "0.0.0.0"
                published = parts[-2] if len(parts) >= 2 else None
            assert published, f"{name}: {port} publishes a random host port"
            yield name, address, int(str(published)), protocol or "tcp"


def test_published_ports_do_not_collide_and_stay_on_loopback() -> None:
    seen: dict[tuple[int, str], str] = {}
    for name, address, port, protocol in published_ports():
        assert address == LOOPBACK, f"{name}: publishes {port} on {address}, not only on loopback"
        assert (port, protocol) not in seen, f"{name} and {seen[port, protocol]} publish {port}"
        seen[port, protocol] = name
    assert {name for name, *_ in published_ports()} == {
        "grafana",
        "prometheus",
        "alertmanager",
        "kafka",
    }


def test_secrets_come_from_the_uncommitted_env_file() -> None:
    example = read_env_file(EXAMPLE_ENV)
    used = compose_variables()
    assert set(example) == set(used), "deploy/example.env and the compose file disagree"
    for name, raw in raw_compose()["services"].items():
        for variable, value in environment(raw).items():
            if SECRET_NAME.search(variable):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:?\?[^}]*)?\}", value), (
                    f"{name}: {variable} is not taken from .env"
                )
    ignored = {line.strip() for line in GITIGNORE.read_text().splitlines()}
    assert ignored & {".env", "/.env"}, ".gitignore does not keep .env out of git"
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    assert "*" in patterns and "!.env" not in patterns, ".dockerignore lets .env into the image"


def test_prometheus_config_passes_promtool(promtool: str) -> None:
    done = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout, done.stdout


def test_prometheus_loads_the_rules_of_alerts_and_scrapes_the_workers() -> None:
    service = services()["prometheus"]
    config_in_container = PurePosixPath(flag_value(words(service["command"]), "--config.file"))
    assert host_path(service, config_in_container) == PROMETHEUS
    config = yaml.safe_load(PROMETHEUS.read_text())
    rules = []
    for rule_file in config["rule_files"]:
        in_container = PurePosixPath(posixpath.normpath(config_in_container.parent / rule_file))
        in_repository = (PROMETHEUS.parent / rule_file).resolve()
        assert host_path(service, in_container) == in_repository, rule_file
        rules.append(in_repository)
    assert rules == [RULES]

    # Each splitbrain service that serves /metrics is scraped where it serves, the workers as
    # job `splitbrain` (the job the rules name), and nothing else under that job.
    scraped = {
        (job["job_name"], target)
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    serving = {}
    for name, service in splitbrain_services().items():
        env = environment(service)
        ports = [v for v in env if v.endswith("METRICS_PORT") and env[v] != "0"]
        if not ports:
            continue
        (port,) = ports
        # The default address is loopback, which another container cannot reach.
        assert env.get(port.removesuffix("PORT") + "ADDRESS") == "0.0.0.0", name
        serving[f"{name}:{env[port]}"] = program_words(name, service)[0]
    assert {target for _, target in scraped if target in serving} == set(serving)
    workers = {target for target, command in serving.items() if command[1:] == ("worker",)}
    assert len(workers) == 2
    assert {target for job, target in scraped if job == "splitbrain"} == workers
    alertmanagers = {
        t
        for a in config["alerting"]["alertmanagers"]
        for c in a["static_configs"]
        for t in c["targets"]
    }
    assert alertmanagers == {"alertmanager:9093"}
    assert "alertmanager" in services()


def test_alertmanager_config_passes_amtool_and_routes_each_severity(amtool: str) -> None:

    def run(*args: str) -> str:
        done = subprocess.run(
            [amtool, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    config_path = str(ALERTMANAGER.relative_to(ROOT))
    run("check-config", config_path)
    config = yaml.safe_load(ALERTMANAGER.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    severities = {
        rule["labels"]["severity"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    assert severities == {"page", "ticket", "warning"}
    routed = {
        severity: run(
            "config", "routes", "test", f"--config.file={config_path}", f"severity={severity}"
        ).split()
        for severity in severities
    }
    assert routed["page"] == ["pager"] and receivers["pager"].get("pagerduty_configs"), routed
    assert routed["ticket"] == ["tickets"] and receivers["tickets"].get("webhook_configs"), routed
    assert routed["warning"] == ["dashboards"], routed

    # The secret is a file in the tmpfs the entrypoint writes, never a value in the config.
    service = services()["alertmanager"]
    assert (
        host_path(service, PurePosixPath(flag_value(words(service["command"]), "--config.file")))
        == ALERTMANAGER
    )
    assert words(service["entrypoint"])[0] == "/bin/sh"
    assert host_path(service, PurePosixPath(words(service["entrypoint"])[1])) == (
        ALERTMANAGER_ENTRYPOINT
    )
    script = ALERTMANAGER_ENTRYPOINT.read_text()
    for receiver in receivers.values():
        for pagerduty in receiver.get("pagerduty_configs") or []:
            assert not {"routing_key", "service_key"} & set(pagerduty), receiver["name"]
            secret = PurePosixPath(pagerduty["routing_key_file"])
            assert any(PurePosixPath(t) in secret.parents for t in service.get("tmpfs") or [])
            assert str(secret) in script, f"entrypoint.sh does not write {secret}"
    sh = subprocess.run(
        ["/bin/sh", "-n", str(ALERTMANAGER_ENTRYPOINT)], capture_output=True, text=True, check=False
    )
    assert sh.returncode == 0, sh.stderr


def test_grafana_provisions_prometheus_and_the_dashboards_of_the_repository() -> None:
    service = services()["grafana"]
    assert host_path(service, PurePosixPath("/etc/grafana/provisioning")) == GRAFANA_PROVISIONING

    sources = [
        source
        for path in sorted((GRAFANA_PROVISIONING / "datasources").glob("*.yml"))
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]
    assert [s["type"] for s in sources] == ["prometheus"]
    assert sources[0]["url"] == "http://prometheus:9090"
    assert sources[0].get("isDefault") is True

    providers = [
        provider
        for path in sorted((GRAFANA_PROVISIONING / "dashboards").glob("*.yml"))
        for provider in yaml.safe_load(path.read_text())["providers"]
    ]
    assert providers
    for provider in providers:
        assert provider["type"] == "file"
        found = host_path(service, PurePosixPath(provider["options"]["path"]))
        assert found == DASHBOARDS, provider
    dashboard = json.loads((DASHBOARDS / "splitbrain.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"


def test_the_demo_fleet_shares_one_job_class_that_keeps_the_lease_rule() -> None:
    classes = set()
    for service in services().values():
        argv = words(service.get("command"))
        if "--job-class" in argv:
            classes.add(flag_value(argv, "--job-class"))
    assert len(classes) == 1, classes
    JobClass.model_validate_json(classes.pop())  # L > R x H + J, or it raises


def test_dockerfile_is_multi_stage_pinned_unprivileged_and_healthchecked() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "not multi-stage"
    names = [name for _, name, _ in stages]
    for base, _, _ in stages:
        if base in names:
            continue
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?", base), f"{base}: not pinned"
    (_, build, build_steps), *_, (_, _, final) = stages
    assert build, "the first stage has no name"
    assert any(i == "RUN" and "pip wheel" in a for i, a in build_steps), "no wheel is built"
    assert any(i == "COPY" and f"--from={build}" in a for i, a in final), "nothing copied"
    users = [arguments for instruction, arguments in final if instruction == "USER"]
    assert users, "the image runs as root"
    user = users[-1].partition(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1]}"
    assert image_exec_form("ENTRYPOINT") == ["splitbrain"]
    checks = [arguments for instruction, arguments in final if instruction == "HEALTHCHECK"]
    assert checks and checks[-1] != "NONE" and "/metrics" in checks[-1], "no healthcheck"
    ignored = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    assert "*" in ignored, ".dockerignore does not start from nothing"
