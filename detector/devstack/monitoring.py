"""Alertmanager and Prometheus from Debian's packages, on loopback: Prometheus with the bundled
alerting rules, scraping the detector workers and evaluating every second, sending to an
Alertmanager that holds what it is sent (no notification channel: the demo reads it)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from detector import bundled
from detector.devstack.components import Process, pid_note
from detector.devstack.process import free_port, http_ok

if TYPE_CHECKING:
    from detector.devstack.stack import Stack

SCRAPE_JOB: Final = "splitbrain"  # the job the alerting rules expect


def alertmanager(stack: Stack, program: str) -> None:
    """Alertmanager (`program`) in the stack, ready once `/-/ready` answers."""
    port = stack.options.alertmanager_port or free_port()
    home = stack.dir / "alertmanager"
    config = _yaml(
        home / "alertmanager.yml",
        {
            "route": {
                "receiver": "demo",
                "group_by": ["alertname", "finding_id"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            # No notification channel: the demo reads what Alertmanager holds.
            "receivers": [{"name": "demo"}],
        },
    )
    _start(
        stack,
        "alertmanager",
        program,
        port,
        config,
        f"--storage.path={home / 'data'}",
        "--cluster.listen-address=",  # no gossip port on every interface
        pages={"ui": "/#/alerts"},
        ready=lambda url: http_ok(f"{url}/-/ready"),
    )


def prometheus(stack: Stack, program: str) -> None:
    """Prometheus (`program`) in the stack, scraping its detectors, ready once it has scraped
    each of them."""
    port = stack.options.prometheus_port or free_port()
    home = stack.dir / "prometheus"
    rules = home / bundled.RULES.name
    home.mkdir(parents=True, exist_ok=True)
    rules.write_bytes(bundled.resource(bundled.RULES).read_bytes())
    targets = [f"127.0.0.1:{w.metrics_port}" for w in stack.detectors]
    alerting: dict[str, Any] = {}
    am = stack.url("alertmanager")
    if am is not None:
        target = am.removeprefix("http://")
        alerting = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    config = _yaml(
        home / "prometheus.yml",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            **({"alerting": alerting} if alerting else {}),
            "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [{"targets": targets}]}],
        },
    )
    _start(
        stack,
        "prometheus",
        program,
        port,
        config,
        f"--storage.tsdb.path={home / 'tsdb'}",
        pages={"alerts": "/alerts"},
        # Ready once it has scraped every detector: a counter's first sample must be
        # its 0, or increase() would not see the first critical finding.
        ready=lambda url: _scraped(url, len(targets)),
        note=f" (rules: {rules.name})",
    )


def _start(
    stack: Stack,
    name: str,
    program: str,
    port: int,
    config: Path,
    *flags: str,
    pages: Mapping[str, str],
    ready: Callable[[str], bool],
    note: str = "",
) -> None:
    """Start `program` on loopback `port` with `config`: Prometheus and Alertmanager take the
    same flags for these, and are logged, recorded and narrated alike. `pages` are paths under
    its URL to record beside it; `ready` is asked with the URL."""
    url = f"http://127.0.0.1:{port}"
    comp = Process(
        name,
        urls={"url": url, **{page: f"{url}{path}" for page, path in pages.items()}},
        log=stack.dir / "logs" / f"{name}.log",
        argv=[
            program,
            f"--config.file={config}",
            *flags,
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        ready=lambda: ready(url),
    )
    stack.add(comp)
    stack.say(f"started {name:<13} {url}{note}{pid_note(comp)}")


def _scraped(url: str, targets: int) -> bool:
    """Prometheus is ready and has scraped each of `targets` successfully."""
    if not http_ok(f"{url}/-/ready"):
        return False
    query = urllib.parse.urlencode({"query": f'up{{job="{SCRAPE_JOB}"}} == 1'})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as answer:
            result = json.loads(answer.read())["data"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(result, list) and len(result) >= targets


def _yaml(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return path
