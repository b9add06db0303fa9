"""A worker's long-lived objects leave the collector's reach, at most every few seconds, and stay
freed by reference counting."""

import gc
import json
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from detector.core import Detector
from detector.gc_tuning import Freezer
from detector.runtime.processor import PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.histories import event_obj


class State:
    """A stand-in for a workflow's state: a container the collector tracks."""


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_freeze_moves_what_is_alive_out_of_every_generation_at_most_every_period() -> None:
    freeze = Freezer(every_s=5.0)
    held = [State() for _ in range(100)]
    assert freeze(1000.0)
    assert gc.get_freeze_count() >= len(held)
    assert not any(map(_collectable, held))
    later = State()
    assert not freeze(1004.9)
    assert _collectable(later)
    assert freeze(1005.0)
    assert not _collectable(later)


def _collectable(o: object) -> bool:
    """Whether a collection still walks `o`: in one of the three generations, not frozen. (The
    frozen count alone says nothing: it falls whenever any frozen object is freed.)"""
    return any(x is o for generation in range(3) for x in gc.get_objects(generation))


def test_a_frozen_object_is_still_freed_when_its_last_reference_goes() -> None:
    freeze = Freezer()
    state = State()
    gone = weakref.ref(state)
    freeze(0.0)
    del state
    assert gone() is None


def _fleet(workflows: int) -> list[tuple[bytes, bytes]]:
    """Workflows in turn: an owner's work, a takeover, the displaced owner's stale commit (a
    critical finding), the new owner's commit and a verification, then a release."""
    records = []
    for w in range(workflows):
        wf = f"wf-{w}"
        steps = [
            ("lease_acquired", 1, "w1", None, "coordinator"),
            ("heartbeat", 1, "w1", None, "worker"),
            ("lease_acquired", 2, "w2", None, "coordinator"),
            ("effect_committed", 1, "w1", "k", "destination"),
            ("effect_committed", 2, "w2", "k", "destination"),
            ("outcome_verified", 2, "checker", "k", "verifier"),
            ("lease_released", 2, "w2", None, "worker"),
        ]
        for seq, (kind, epoch, worker, key, source) in enumerate(steps, 1):
            obj = event_obj(f"{wf}-{seq}", kind, wf, epoch, worker, seq=seq, key=key, source=source)
            records.append((wf.encode(), json.dumps(obj).encode()))
    return records


def _frozen_garbage(records: list[tuple[bytes, bytes]], every: int) -> int:
    """What a full collection finds unreachable among the frozen objects after the processing
    step ran on `lines` with a freeze every `every` events: garbage a worker would keep."""
    processor = PartitionProcessor(0, Detector(), WorkerMetrics(CollectorRegistry()))
    gc.collect()
    for offset, (key, value) in enumerate(records):
        processor.process(key, value, "in", offset, 1000.0 + offset / 100)
        if offset % every == every - 1:
            processor.tick(1000.0 + offset / 100)
            Freezer(every_s=0.0)(0.0)
    gc.collect()  # the garbage nobody froze
    gc.unfreeze()
    return gc.collect()


def test_the_processing_step_leaves_no_garbage_for_a_freeze_to_keep() -> None:
    """A frozen reference cycle that becomes garbage is never freed: the step on a fleet with
    handoffs, zombies, findings and evictions makes none, however often it is frozen."""
    records = _fleet(1_000)
    assert _frozen_garbage(records, 50) == _frozen_garbage(records, 5_000) == 0
