"""`python -m detector.testing.stalling_worker worker [flags]`: `splitbrain worker` on the kafka
runtime that stalls once where a signal arms it, logging a mark and going on `STALL_S` later:
the window in which a test stops or kills it, as a machine that stalls there would.

- SIGUSR1: the next revocation, as it begins (`STALL_MARK`).
- SIGUSR2: the next commit that writes states, once they are in its transaction and before it
  commits (`COMMIT_MARK`): a worker killed there leaves a transaction open on its partitions.

Unarmed, it is the worker."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any, Final

from detector.cli import worker
from detector.core import Detector
from detector.runtime.checkpoint import Record
from detector.runtime.kafka_loop import KafkaLoopWorker

STALL_MARK: Final = "a revocation begins"
COMMIT_MARK: Final = "a transaction holds its states"
STALL_S: Final = 3.0

log = logging.getLogger(__name__)


class StallingWorker(KafkaLoopWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._armed: set[str] = set()
        signal.signal(signal.SIGUSR1, lambda *_: self._armed.add(STALL_MARK))
        signal.signal(signal.SIGUSR2, lambda *_: self._armed.add(COMMIT_MARK))

    def _stall(self, mark: str, what: str) -> None:
        if mark in self._armed:
            self._armed.discard(mark)
            log.warning("%s: %s", mark, what)
            time.sleep(STALL_S)

    def partitions_revoked(self, partitions: list[int]) -> None:
        self._stall(STALL_MARK, f"partitions {sorted(partitions)}")
        super().partitions_revoked(partitions)

    def _produce_states(self, records: list[Record]) -> dict[int, int]:
        written = super()._produce_states(records)
        if records:
            self._stall(COMMIT_MARK, f"{len(records)} changelog records")
        return written


def main() -> int:
    parser = argparse.ArgumentParser(prog="stalling_worker", description=__doc__)
    worker.register(parser.add_subparsers(dest="command", required=True))
    return worker.run_worker(parser.parse_args(), Detector, StallingWorker)


if __name__ == "__main__":
    sys.exit(main())
