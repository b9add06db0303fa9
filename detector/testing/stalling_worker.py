"""`python -m detector.testing.stalling_worker worker [flags]`: `splitbrain worker` on the kafka
runtime that logs `STALL_MARK` as each revocation begins and only goes on `STALL_S` later: the
window in which a test stops it (SIGSTOP), as a machine that stalls mid-rebalance would."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Final

from detector.cli import worker
from detector.core import Detector
from detector.runtime.kafka_loop import KafkaLoopWorker

STALL_MARK: Final = "a revocation begins"
STALL_S: Final = 3.0

log = logging.getLogger(__name__)


class StallingWorker(KafkaLoopWorker):
    def partitions_revoked(self, partitions: list[int]) -> None:
        log.warning("%s: partitions %s", STALL_MARK, sorted(partitions))
        time.sleep(STALL_S)
        super().partitions_revoked(partitions)


def main() -> int:
    parser = argparse.ArgumentParser(prog="stalling_worker", description=__doc__)
    worker.register(parser.add_subparsers(dest="command", required=True))
    return worker.run_worker(parser.parse_args(), Detector, StallingWorker)


if __name__ == "__main__":
    sys.exit(main())
