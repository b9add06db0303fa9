"""What a campaign's worker process uses: the adapter sink bound to the campaign's input topic,
and the name its adapter gives it by default (what the fleet notes its faults against)."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Final

from detector.adapters import AdapterSink
from detector.contracts.topics import INPUT_TOPIC
from detector.kafka.emit import Emitter

TOPIC_ENV: Final = "SPLITBRAIN_CAMPAIGN_TOPIC"


def sink(adapter: str) -> AdapterSink:
    """An adapter's sink to the campaign's input topic (the product's when not in a campaign),
    on the broker the `SPLITBRAIN_*` variables name.

    Its Kafka producer is made now, at the worker's start, not at its first event: the nemesis
    steps a worker's clock once the worker is ready, and a librdkafka producer made in a process
    whose clock libfaketime has stepped back holds the whole process, the GIL included, for 60 s
    in most tries (`nemesis._backward`). A worker frozen so loses its work to the system, acts
    on it when it thaws, and may be killed at the run's end with that zombie's events unsent:
    the likely cause of the Temporal tests' misses under load, and the cause of kubernetes run
    26's miss in the 50b6f43 campaign (a frozen holder lost its Lease mid-unit). A worker
    restarted while its clock is stepped still makes its producer under the step. A later
    producer (after a failed one, or in a forked child, which cannot use its parent's) is made
    when the sink asks."""
    topic = os.environ.get(TOPIC_ENV, INPUT_TOPIC)
    made: list[Emitter] = []
    # No broker configured: the sink says so at its first event.
    with contextlib.suppress(Exception):
        made.append(Emitter.from_env(topic=topic))
    maker = os.getpid()

    def publisher() -> Emitter:
        if made and os.getpid() == maker:
            return made.pop()
        return Emitter.from_env(topic=topic)

    return AdapterSink(adapter, publisher=publisher)


def executor(pid: int) -> str:
    """The worker id an adapter gives a process by default (host:pid), as the truth names the
    executor: what the fleet notes a fault against."""
    return f"{socket.gethostname()}:{pid}"
