"""`splitbrain watch`'s `Publisher`: a watcher's batch waits out a Kafka outage instead of ending
the watcher, and a batch Kafka refused is neither saved nor kept in the watcher's memory.

The etcd campaign's run 15 missed a stale write so: a broker restart of 38 s made the watcher's
flush give up after 30 s and the watcher exit, before it had published the takeover that made
the write stale (docs/campaign.md)."""

from __future__ import annotations

import base64
import json
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("etcd3gw", reason="the etcd extra is not installed (.[etcd])")

from detector.adapters._etcd_watch import parse_response
from detector.adapters._watch import WatchMetrics
from detector.adapters.etcd import LockWatcher
from detector.cli.watch import Publisher
from detector.kafka.emit import DeliveryError, DeliveryFailure

A, B = "/locks/a", "/locks/b"


class Kafka:
    """An emitter whose broker is away for `away` flushes, then takes everything, or refuses."""

    def __init__(self, away: int = 0, *, refuse: bool = False) -> None:
        self.away = away
        self.refuse = refuse
        self.sent: list[dict[str, Any]] = []
        self.flushes = 0

    def emit(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    def flush(self, timeout: float = 30.0) -> None:
        self.flushes += 1
        if self.refuse:
            failure = DeliveryFailure(self.sent[-1]["workflow_key"], "Broker: refused")
            raise DeliveryError("1 event(s) not delivered", [failure])
        if self.flushes <= self.away:
            raise DeliveryError(f"1 event(s) not acknowledged within {timeout:g}s", [], 1)


def acquired(prefix: str, revision: int) -> Any:
    kv = {
        "key": base64.b64encode(prefix.encode()).decode(),
        "create_revision": str(revision),
        "mod_revision": str(revision),
        "lease": "26",
    }
    return parse_response(
        {"result": {"header": {"revision": str(revision)}, "events": [{"kv": kv}]}}
    )


def lock_watcher() -> LockWatcher:
    return LockWatcher([A, B], lambda lease: (7, 10), WatchMetrics("etcd", CollectorRegistry()))


def saved(path: Path) -> dict[str, int]:
    return {p: u["revision"] for p, u in json.loads(path.read_text())["etcd"].items()}


def test_a_kafka_outage_longer_than_one_wait_is_waited_out(tmp_path: Path) -> None:
    watcher = lock_watcher()
    kafka = Kafka(away=3)  # three waits without an acknowledgement: a long broker restart
    publisher = Publisher(kafka, tmp_path / "state.json", "etcd", watcher.state)  # type: ignore[arg-type]

    publisher.publish(watcher.apply(A, acquired(A, 1646)))

    assert [e["seq"] for e in kafka.sent] == [1646]
    assert saved(tmp_path / "state.json")[A] == 1646


def test_a_stop_ends_the_wait(tmp_path: Path) -> None:
    watcher = lock_watcher()
    publisher = Publisher(Kafka(away=10**6), tmp_path / "state.json", "etcd", watcher.state)  # type: ignore[arg-type]
    stop = threading.Event()
    stop.set()

    with pytest.raises(DeliveryError):
        publisher.publish(partial(watcher.apply, A, acquired(A, 1646)), stop=stop)

    assert not (tmp_path / "state.json").exists()


def test_a_batch_kafka_refused_is_neither_saved_nor_remembered(tmp_path: Path) -> None:
    watcher = lock_watcher()
    state = tmp_path / "state.json"
    before = {A: watcher.state()[A]}
    refusing = Publisher(Kafka(refuse=True), state, "etcd", watcher.state)  # type: ignore[arg-type]

    with pytest.raises(DeliveryError):
        refusing.publish(
            partial(watcher.apply, A, acquired(A, 1646)), undo=lambda: watcher.restore(before)
        )
    # Another prefix's batch, acknowledged, saves the whole watcher: not A's refused progress.
    Publisher(Kafka(), state, "etcd", watcher.state).publish(  # type: ignore[arg-type]
        partial(watcher.apply, B, acquired(B, 1647))
    )

    assert saved(state) == {A: 0, B: 1647}
    # The watch on A resumes before the refused revision, and the takeover is made again.
    assert [e["seq"] for e in watcher.apply(A, acquired(A, 1646))] == [1646]
