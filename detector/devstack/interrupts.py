"""Ctrl-C, SIGTERM and SIGHUP for a command that starts the stack: never lost while a process
is spawned and not yet recorded, never acted on while the stack stops."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Final


class Interrupts:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP as `KeyboardInterrupt` in the main thread, once
    `install`ed: deferred while a process is spawned and recorded (so none is ever started
    without its PID on record), and ignored while the stack stops."""

    SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._depth = 0
        self._pending = False
        self._stopping = 0
        self.received: int | None = None

    def install(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self._stopping:
            return
        if self._depth:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending and not self._stopping:
                self._pending = False
                raise KeyboardInterrupt

    @contextlib.contextmanager
    def ignored(self) -> Iterator[None]:
        self._stopping += 1
        try:
            yield
        finally:
            self._stopping -= 1


interrupts = Interrupts()
