"""The hand-off between the threads that queue items and the daemon thread that takes them (the
Kafka sink's sender, LangGraph's ledger runner): the taker sleeps when the queue is empty, and a
putter wakes it only then, since a wake-up costs a put more than queueing its item.

A putter appends, then clears `idle` if it is set, then sets `wake` if the taker is `sleeping`.
The taker says it is sleeping before its last look at the queue (`rest`), so an item appended
after that look always finds it marked as sleeping, and wakes it.
"""

from __future__ import annotations

import threading
from collections.abc import Sized


class Handoff:
    __slots__ = ("idle", "sleeping", "wake")

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.idle = threading.Event()  # the queue was empty at the taker's last look
        self.idle.set()
        self.sleeping = False  # the taker waits on `wake` (set before its last look)

    def rest(self, queue: Sized, timeout: float) -> bool:
        """The taker found `queue` empty: idle until woken or `timeout`. False, without
        waiting, when an item came in meanwhile."""
        self.idle.set()
        self.sleeping = True  # before the last look: a later put wakes us
        if queue:  # put while idle was being set
            self.sleeping = False
            self.idle.clear()
            return False
        self.wake.wait(timeout)
        self.sleeping = False
        self.wake.clear()
        return True
