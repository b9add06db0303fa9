"""Adapters: the ownership signals of systems teams already run, as splitbrain events.

Each adapter (`detector.adapters.temporal`, `.celery`, `.langgraph`, `.etcd`, `.kubernetes`,
`.redis_lock`, `.kafka_consumer`) is imported on its own and needs its pip extra
(`splitbrain-detector[temporal]`, …); this package imports none of them. What they share: a sink
that never blocks or fails the host (`AdapterSink`), and the current ownership for the user's
effect calls (`effect_committed` inside a task or activity carries its workflow key and epoch,
and the owner's words: the source system's own names for the work, which a finding's `context`
shows; `words` makes them).
"""

from ._context import (
    Authority,
    Ownership,
    current,
    effect_attempted,
    effect_committed,
    effect_rejected,
    owning,
    progress,
    words,
)
from ._sink import AdapterSink, DropReason, Publisher

__all__ = [
    "AdapterSink",
    "Authority",
    "DropReason",
    "Ownership",
    "Publisher",
    "current",
    "effect_attempted",
    "effect_committed",
    "effect_rejected",
    "owning",
    "progress",
    "words",
]
