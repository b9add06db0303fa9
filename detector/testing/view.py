"""`splitbrain ui` for tests, benchmarks and scripts: findings published to a topic, the view
started on them (a real process on a free loopback port, stopped by PID) and Debian's chromium
to look at it. The browser needs `selenium` (the dev extra) and Debian's chromium-driver."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import Producer

from detector.contracts.findings import Finding
from detector.devstack.process import Pid, log_tail, stop_pids
from detector.errors import SplitbrainError

if TYPE_CHECKING:
    from selenium import webdriver

READY_TIMEOUT: Final = 60.0
CHROMIUM_FLAGS: Final = (
    "--headless",
    "--no-sandbox",  # root in CI
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


class ViewError(SplitbrainError):
    """The view did not start or get ready: its log's tail says why."""


def publish(kafka: Mapping[str, Any], topic: str, findings: Iterable[Finding]) -> None:
    """Each finding as the detector publishes it: its JSON, keyed by its workflow."""
    producer = Producer(dict(kafka))
    for f in findings:
        producer.produce(topic, f.to_json().encode(), f.workflow_key.encode("utf-8", "replace"))
    if producer.flush(30.0):
        raise ViewError(f"could not publish the findings to {topic}")


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def fetched(url: str, timeout: float = READY_TIMEOUT) -> str:
    """The body at `url` once it answers 200 (a view still reading its topic answers 404 for a
    finding it has not read yet); the last error after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return str(answer.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def running_view(env: Mapping[str, str], log: Path, *argv: str) -> Iterator[str]:
    """`splitbrain ui --listen 127.0.0.1:0 ARGV…` (a later --listen wins), until the block ends;
    yields its URL (`http://127.0.0.1:PORT/`) once /healthz says it read the whole topic."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "detector.cli", "ui", "--listen", "127.0.0.1:0", *argv],
            stdout=subprocess.PIPE,
            stderr=out,
            env=dict(env),
            start_new_session=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()  # the first line names the URL, or none comes
        if not line.startswith("splitbrain ui: serving "):
            proc.wait(READY_TIMEOUT)
            raise ViewError(f"splitbrain ui exited with {proc.returncode}: {log_tail(log)}")
        url = line.split()[3]
        deadline = time.monotonic() + READY_TIMEOUT
        while not _ready(url + "healthz"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ViewError(f"splitbrain ui did not get ready: {log_tail(log)}")
            time.sleep(0.1)
        yield url
    finally:

        def reap() -> None:
            proc.poll()

        stop_pids([Pid.of(proc.pid)], reap=reap)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def chromium(chromium_path: str, driver_path: str, profile: Path) -> Iterator[webdriver.Chrome]:
    """Debian's headless chromium, driven through its chromium-driver (nothing downloaded)."""
    from selenium import webdriver  # noqa: PLC0415 (the dev extra)
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()
