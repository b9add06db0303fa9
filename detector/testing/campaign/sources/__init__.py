"""The campaign's sources, one module each, loaded by name (`bench/campaign.py --source`): each
imports its system's client only when it runs."""

from __future__ import annotations

import importlib
from typing import Final

from detector.testing.campaign.source import Source

# name -> module under this package
SOURCES: Final = {
    "leases": "leases",
    "temporal-activity": "temporal_activity",
    "temporal-workflow": "temporal_workflow",
    "celery": "celery",
    "langgraph": "langgraph",
    "etcd": "etcd",
    "kubernetes": "kubernetes",
    "redis-lock": "redis_lock",
    "kafka-consumer": "kafka_consumer",
}


def load(name: str) -> Source:
    module = importlib.import_module(f"{__name__}.{SOURCES[name]}")
    source: Source = module.source()
    return source
