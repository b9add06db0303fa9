"""The demo fleet's work: enqueue one job of a class into the lease store every few seconds, until
SIGTERM. docker-compose.yml runs it in the splitbrain image (service `demo-jobs`):

    python /opt/splitbrain/demo/enqueue_jobs.py --dsn DSN --job-class '{...}' [--interval-s 2]

The demo lease workers (`python -m detector.devstack.lease_worker`) claim the jobs and send each
effect to the fenced destination; the relay publishes every transition to the detector. Each job
writes its own entity (the job id), so that the destination's per-entity fence compares owners of
one job only. The password comes from PGPASSWORD, never from the command line.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import signal
import sys
import threading
import uuid
from types import FrameType

from detector.leases import JobClass, Labels, LeaseError, LeaseStore

log = logging.getLogger("demo-jobs")
LABELS = Labels(tool_class="demo", model="none", provider="compose")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="enqueue_jobs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="the lease store's database (no password)")
    parser.add_argument("--job-class", required=True, type=JobClass.model_validate_json)
    parser.add_argument("--interval-s", type=float, default=2.0, help="seconds between two jobs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(message)s")
    job_class: JobClass = args.job_class
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    run = uuid.uuid4().hex[:8]  # a restart enqueues new jobs, not the keys of the last run
    with LeaseStore(args.dsn, [job_class]) as store:
        for n in itertools.count(1):
            if stop.wait(args.interval_s):
                break
            try:
                store.enqueue(job_class.name, f"demo:{run}:{n}", {"n": n}, LABELS)
            except LeaseError as exc:  # the database is away: try the next one later
                log.warning("job %d not enqueued: %s", n, exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
