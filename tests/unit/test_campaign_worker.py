"""A campaign worker's sink has its Kafka producer made at the worker's start (`worker.sink`):
the nemesis steps a worker's clock once the worker is ready, and a producer made after a
libfaketime step can freeze its whole process for a minute."""

from __future__ import annotations

import json
import os

import pytest

from detector.contracts.events import Kind, OwnershipEvent
from detector.kafka.emit import Emitter
from detector.testing.campaign import worker


class Emitted:
    """Stands in for one `Emitter`: the workflow keys of what it was given."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.keys: list[str] = []

    def publish(self, event: OwnershipEvent, value: bytes) -> None:
        self.keys.append(event.workflow_key)

    def publish_json(self, workflow_key: str, value: bytes) -> None:
        self.keys.append(workflow_key)

    def flush(self, timeout: float = 0) -> None:
        pass

    def close(self) -> None:
        pass


class Made:
    """Stands in for `Emitter.from_env`: every emitter it made, in order."""

    def __init__(self) -> None:
        self.emitters: list[Emitted] = []

    def __call__(self, *, topic: str) -> Emitted:
        self.emitters.append(Emitted(topic))
        return self.emitters[-1]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Made:
    made = Made()
    monkeypatch.setattr(Emitter, "from_env", made)
    monkeypatch.setenv(worker.TOPIC_ENV, "campaign.in")
    return made


def test_the_producer_is_made_at_the_start_and_sends_the_first_event(made: Made) -> None:
    """Made at the first event, as the product's sink does, it was made after the nemesis had
    stepped the worker's clock: a Temporal worker froze, the GIL held, lost its work to the
    others, and was once still frozen when the run's end killed it (seed 39, run 1, loaded)."""
    sink = worker.sink("temporal")
    assert [e.topic for e in made.emitters] == ["campaign.in"]  # before any event
    sink.send(Kind.HEARTBEAT, workflow_key="wf", owner_epoch=1, worker_id="w")
    sink.close(5)
    assert [e.keys for e in made.emitters] == [["wf"]]


def test_a_forked_child_makes_a_producer_of_its_own(made: Made) -> None:
    """Celery's prefork children: the parent's producer has no threads in a child."""
    sink = worker.sink("celery")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            sink.send(Kind.HEARTBEAT, workflow_key="child", owner_epoch=1, worker_id="w")
            sink.close(5)
            os.write(write, json.dumps([e.keys for e in made.emitters]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    keys = json.loads(os.read(read, 65536))
    os.close(read)
    assert keys == [[], ["child"]]
