#!/usr/bin/env python3
"""Run the torture harness by hand: against a local broker it starts, or any cluster.

python scripts/torture.py --events 100000 --kills 20            # local broker, all faults
python scripts/torture.py --standby ...                         # with warm standby copies
python scripts/torture.py --bootstrap-servers host:9092 ...     # any cluster: no broker faults
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from detector.devstack.kafka import ClientConfig, LocalKafka
from detector.testing.torture.harness import Harness, Plan, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--bootstrap-servers", help="an existing cluster (PLAINTEXT); default: start one"
    )
    ap.add_argument("--runtime", default="kafka", choices=("kafka", "faust"))
    ap.add_argument("--store", default="memory", choices=("memory", "rocksdb"))
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--terms", type=int, default=3)
    ap.add_argument("--zombies", type=int, default=2)
    ap.add_argument("--broker-kills", type=int, default=2)
    ap.add_argument("--broker-pauses", type=int, default=2)
    ap.add_argument("--storms", type=int, default=10)
    ap.add_argument("--rate", type=float, default=1000.0, help="events/s published during faults")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--standby",
        action="store_true",
        help="every worker keeps the others' partitions warm (`splitbrain worker --standby all`)",
    )
    args = ap.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="splitbrain-torture-"))
    plan = Plan(
        events=args.events,
        kills=args.kills,
        terms=args.terms,
        zombies=args.zombies,
        broker_kills=args.broker_kills,
        broker_pauses=args.broker_pauses,
        storms=args.storms,
        rate=args.rate,
        quiescence_s=900,
    )
    broker = None
    if args.bootstrap_servers is None:
        broker = LocalKafka(workdir / "kafka")
        broker.start()
    config: ClientConfig = (
        broker.client_config() if broker else {"bootstrap.servers": args.bootstrap_servers}
    )
    try:
        harness = Harness(
            config,
            workdir / "run",
            runtime=args.runtime,
            store=args.store,
            worker_flags=("--standby", "all") if args.standby else (),
            partitions=args.partitions,
            tag=f"torture-{args.runtime}",
        )
        log = lambda line: print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)  # noqa: E731
        report = run(harness, plan, broker=broker, log=log)
    finally:
        if broker is not None:
            broker.stop()
    print(report.render())
    print(f"worker logs: {workdir / 'run'}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
