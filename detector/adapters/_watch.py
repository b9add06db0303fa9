"""What the etcd and Kubernetes watchers share: their counters and the events they make.

A watcher is the coordination store's own view of who holds a lease, so its acquisitions and
ends are the coordinator's word (`source: coordinator`), ordered by the store's revision (`seq`).
Bad input and gaps are counted here with bounded labels (`watcher`, `reason`) and logged with
the key by the watcher: never a silent gap, never a stopped watcher.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from detector.contracts.events import AUTHORITY_ATTR, EPOCH_FROM_ATTR, Kind, Source

from ._context import Authority

# The key and value of an event's `attrs` that say the event follows a gap in the watch.
GAP_ATTR: Final = "after_gap"


class UnreadableError(ValueError):
    """A watched object that cannot be read as a lease or a lock key: `reason` is a bounded
    label (`WatchMetrics.invalid`), `key` names the object for the log."""

    noun: ClassVar[str] = "object"

    def __init__(self, reason: str, key: str) -> None:
        super().__init__(f"{reason}: {self.noun} {key!r}")
        self.reason = reason
        self.key = key


class WatchMetrics:
    """The watchers' counters, in one registry (the process's, unless a test gives its own)."""

    def __init__(self, watcher: str, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        self.watcher = watcher
        self._invalid = Counter(
            "splitbrain_watch_events_invalid",
            "Watched objects that could not be read as a lease or lock key, by reason",
            ["watcher", "reason"],
            registry=registry,
        )
        self._gaps = Counter(
            "splitbrain_watch_gaps",
            "Times a watch lost history and relisted (etcd compaction, Kubernetes 410 Gone)",
            ["watcher", "reason"],
            registry=registry,
        )
        self._events = Counter(
            "splitbrain_watch_events",
            "Ownership events a watcher made, by kind",
            ["watcher", "kind"],
            registry=registry,
        )

    def invalid(self, reason: str) -> None:
        self._invalid.labels(self.watcher, reason).inc()

    def gap(self, reason: str) -> None:
        self._gaps.labels(self.watcher, reason).inc()

    def made(self, kind: Kind) -> None:
        self._events.labels(self.watcher, kind.value).inc()


@dataclass(frozen=True, slots=True)
class Holder:
    """One lease holder as the store shows it: whose, under which epoch."""

    workflow_key: str
    owner_epoch: int
    worker_id: str
    authority: Authority
    epoch_from: str  # a bounded label: `etcd.create_revision`, `kubernetes.leaseTransitions`…

    def event(
        self,
        kind: Kind,
        *,
        seq: int,
        event_id: str,
        attrs: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """The fields of one event of this holder, as `Emitter.emit` takes them."""
        source = Source.COORDINATOR if self.authority is Authority.SYSTEM else Source.WORKER
        return {
            "kind": kind.value,
            "event_id": event_id,
            "workflow_key": self.workflow_key,
            "owner_epoch": self.owner_epoch,
            "worker_id": self.worker_id,
            "seq": seq,
            "source": source.value,
            "attrs": {
                **(attrs or {}),
                AUTHORITY_ATTR: self.authority.value,
                EPOCH_FROM_ATTR: self.epoch_from,
            },
            **fields,
        }
