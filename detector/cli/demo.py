"""`splitbrain demo`: the product, live, on this machine, in under two minutes.

This module declares the command's flags; the demo itself (the stack, the zombie, the finding,
the page, the verdict and its exit status) is `detector.demos.runner`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from detector.cli.arguments import (
    add_stack_ports,
    positive_int,
    positive_number,
    positive_seconds,
)
from detector.demos import LEASES, SOURCES

DEFAULT_STATE_DIR: Final = Path("var") / "demo"
DEFAULT_TIMEOUT_S: Final = 110.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the product live: a real split-brain, detected, graded and paged (< 2 min)",
        description="Start Kafka, two detector workers, PostgreSQL with the lease store, the "
        "outbox relay, an unfenced example destination, Alertmanager, Prometheus with the "
        "shipped rules and the pager bridge on loopback; run three agent workers over a stream "
        "of jobs; pause one inside its tool call past its lease, so that another takes its job "
        "over and both commit (or, with --source, run another system's zombie); print the "
        "events' rate, the finding's revisions and the alert Alertmanager holds; stop "
        "everything. Exit 0: the critical finding reached "
        "Alertmanager; 1: it did not in time, or a component failed; 2: the machine or a flag "
        "cannot be used (nothing started); 4: a missing Debian package left a part out; 130: "
        "interrupted.",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        default=DEFAULT_STATE_DIR,
        help=f"configs, logs, data and stack.json (default: ./{DEFAULT_STATE_DIR})",
    )
    p.add_argument(
        "--non-interactive",
        action="store_true",
        help="never wait for input: stop everything as soon as the verdict is in (for CI and "
        "tests; also the case when stdin is not a terminal)",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds from start to the page before the demo gives up with exit 1 (default: "
        f"{DEFAULT_TIMEOUT_S:g}; Kafka's first download from Maven Central is not counted)",
    )
    p.add_argument(
        "--jobs", type=positive_int, default=30, metavar="N", help="jobs to enqueue (default: 30)"
    )
    p.add_argument(
        "--job-rate",
        type=positive_number,
        default=1.5,
        metavar="N",
        help="jobs enqueued per second (default: 1.5)",
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        default=LEASES,
        metavar="SYSTEM",
        help=f"whose zombie to run: {', '.join(SOURCES)}; {LEASES} is the lease store's own "
        "fleet, the others run that system's real server and workers, reporting through "
        "splitbrain's adapter; exit 2 with one line when this machine cannot run one "
        f"(default: {LEASES})",
    )
    add_stack_ports(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from detector.demos.runner import Demo, play  # noqa: PLC0415

    return play(
        Demo(
            state_dir=args.state_dir,
            source=args.source,
            timeout_s=args.timeout,
            jobs=args.jobs,
            job_rate=args.job_rate,
            prometheus_port=args.prometheus_port,
            alertmanager_port=args.alertmanager_port,
            destination_port=args.destination_port,
            interactive=not args.non_interactive and sys.stdin.isatty(),
        )
    )
