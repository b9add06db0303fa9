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


def sink(adapter: str, *, connect_now: bool = False) -> AdapterSink:
    """An adapter's sink to the campaign's input topic (the product's when not in a campaign),
    on the broker the `SPLITBRAIN_*` variables name.

    `connect_now` (a process that never forks): its producer is made at once, before the nemesis
    can step the process's clock, and the sink's first connection takes it. Under libfaketime
    0.9.10 a producer made after a backward step stalls about 60 s in librdkafka's
    constructor (its bound on its threads' start), holding the GIL: the whole worker froze,
    lost its Lease mid-unit and became the zombie (kubernetes run 26 of the 50b6f43
    campaign). A real NTP step leaves that wait, on the monotonic clock, alone."""
    topic = os.environ.get(TOPIC_ENV, INPUT_TOPIC)
    made: list[Emitter] = []
    if connect_now:
        # No broker configured: the sink says so at its first event.
        with contextlib.suppress(Exception):
            made.append(Emitter.from_env(topic=topic))

    def publisher() -> Emitter:
        return made.pop() if made else Emitter.from_env(topic=topic)

    return AdapterSink(adapter, publisher=publisher)


def executor(pid: int) -> str:
    """The worker id an adapter gives a process by default (host:pid), as the truth names the
    executor: what the fleet notes a fault against."""
    return f"{socket.gethostname()}:{pid}"
