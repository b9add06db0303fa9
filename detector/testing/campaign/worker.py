"""What a campaign's worker process uses: the adapter sink bound to the campaign's input topic,
and the run's truth log."""

from __future__ import annotations

import os
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
