"""What a campaign's worker process uses: the adapter sink bound to the campaign's input topic,
and the name its adapter gives it by default (what the fleet notes its faults against)."""

from __future__ import annotations

import os
import socket
from typing import Final

from detector.adapters import AdapterSink
from detector.contracts.topics import INPUT_TOPIC
from detector.kafka.emit import Emitter

TOPIC_ENV: Final = "SPLITBRAIN_CAMPAIGN_TOPIC"


def sink(adapter: str) -> AdapterSink:
    """An adapter's sink to the campaign's input topic (the product's when not in a campaign),
    on the broker the `SPLITBRAIN_*` variables name."""
    topic = os.environ.get(TOPIC_ENV, INPUT_TOPIC)
    return AdapterSink(adapter, publisher=lambda: Emitter.from_env(topic=topic))


def executor(pid: int) -> str:
    """The worker id an adapter gives a process by default (host:pid), as the truth names the
    executor: what the fleet notes a fault against."""
    return f"{socket.gethostname()}:{pid}"
