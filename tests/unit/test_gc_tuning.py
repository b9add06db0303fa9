"""A worker's long-lived objects leave the collector's reach, at most every few seconds, and stay
freed by reference counting."""

import gc
import weakref
from collections.abc import Iterator

import pytest

from detector.gc_tuning import Freezer


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
    frozen = gc.get_freeze_count()
    assert frozen >= len(held)
    collected = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
    assert collected.isdisjoint(id(s) for s in held)
    assert not freeze(1004.9)
    assert gc.get_freeze_count() == frozen
    assert freeze(1005.0)


def test_a_frozen_object_is_still_freed_when_its_last_reference_goes() -> None:
    freeze = Freezer()
    state = State()
    gone = weakref.ref(state)
    freeze(0.0)
    del state
    assert gone() is None
