"""What one event costs as a finding or a workflow grows: it must stay flat.

Two adversarial workflows, each fed through the engine with the worker's caps and with `audit`'s:
- a zombie: after a takeover, the displaced owner attempts N distinct effect keys (every event
  adds a condition and a revision);
- a long workflow: 10^5 events of one workflow (heartbeats, progress, effects and verifications
  of the current owner, a takeover every 1,000 events, and a displaced owner acting now and then).

Prints the cost per event in each tenth of the history (flat means no growth with size), the
largest revision, and the revisions published. Asserts nothing.
Run: `python bench/bench_growth.py [--keys N] [--events N]`.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Iterator

from detector import gc_tuning
from detector.contracts.events import OwnershipEvent, parse_event_obj
from detector.core import Config, Detector


def _ev(n: int, kind: str, epoch: int, worker: str, **extra: object) -> OwnershipEvent:
    return parse_event_obj(
        {
            "event_id": f"e{n}",
            "kind": kind,
            "workflow_key": "tenant-7/export/2026-07-26",
            "owner_epoch": epoch,
            "worker_id": worker,
            "seq": n,
            **extra,
        }
    )


def zombie(keys: int) -> Iterator[OwnershipEvent]:
    yield _ev(1, "lease_acquired", 1, "alpha", source="coordinator")
    yield _ev(2, "lease_acquired", 2, "beta", source="coordinator")
    for i in range(keys):
        yield _ev(3 + i, "effect_attempted", 1, "alpha", effect_key=f"reply-to/msg-{i:06d}")


def long_workflow(events: int) -> Iterator[OwnershipEvent]:
    epoch = 1
    for n in range(1, events + 1):
        if n % 1000 == 1:
            epoch += 1
            yield _ev(n, "lease_acquired", epoch, f"w{epoch}", source="coordinator")
        elif n % 97 == 0:
            yield _ev(n, "heartbeat", epoch - 1, f"w{epoch - 1}")  # the displaced owner
        elif n % 10 == 0:
            key = f"shard-{n // 10}"
            yield _ev(n, "effect_committed", epoch, f"w{epoch}", effect_key=key)
        elif n % 10 == 1:
            key = f"shard-{n // 10}"
            yield _ev(n, "outcome_verified", epoch, "checker", effect_key=key, source="verifier")
        else:
            yield _ev(n, "heartbeat" if n % 3 else "progress", epoch, f"w{epoch}")


def run(name: str, events: list[OwnershipEvent], config: Config) -> None:
    detector = Detector(config)
    tenth = max(len(events) // 10, 1)
    costs: list[float] = []
    revisions = largest = 0
    started = time.perf_counter()
    for i, event in enumerate(events, start=1):
        for update in detector.observe(event, at=0.0):
            revisions += 1
            largest = max(largest, len(update.finding.to_json()))
        if i % tenth == 0:
            now = time.perf_counter()
            costs.append((now - started) / tenth * 1e6)
            started = now
    flat = ", ".join(f"{c:.0f}" for c in costs)
    truncated = "truncated" if detector.truncated_workflows() else "exact"
    print(
        f"  {name:<22} {len(events):>7} events: µs/event by tenth [{flat}]; "
        f"{revisions} revisions, largest {largest} B; {truncated}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    gc_tuning.tune()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    histories = {
        "zombie, distinct keys": list(zombie(args.keys)),
        "one long workflow": list(long_workflow(args.events)),
    }
    for label, config in (("worker caps", Config()), ("audit caps", Config.for_audit())):
        print(label)
        for name, events in histories.items():
            run(name, events, config)


if __name__ == "__main__":
    main()
