"""`python -m detector.testing.faulty_worker worker [flags]`: `splitbrain worker` whose engine
raises on every event with the id `FAULT_EVENT_ID`, and works as usual on every other one; for
the tests of what an exception of the engine costs (one event, never its partition)."""

from __future__ import annotations

import argparse
import sys
from typing import Final

from detector.cli import worker
from detector.contracts.events import OwnershipEvent
from detector.core import Detector, FindingUpdate

FAULT_EVENT_ID: Final = "engine-fault"


class InjectedFaultError(RuntimeError):
    """What `FaultyDetector` raises: an unexpected error of the engine."""


class FaultyDetector(Detector):
    def observe(self, event: OwnershipEvent, at: float | None = None) -> list[FindingUpdate]:
        if event.event_id == FAULT_EVENT_ID:
            raise InjectedFaultError(f"raised on purpose on an event of {event.workflow_key}")
        return super().observe(event, at)


def main() -> int:
    parser = argparse.ArgumentParser(prog="faulty_worker", description=__doc__)
    worker.register(parser.add_subparsers(dest="command", required=True))
    return worker.run_worker(parser.parse_args(), FaultyDetector)


if __name__ == "__main__":
    sys.exit(main())
