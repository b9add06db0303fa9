"""Cost of `Detector.advance` at many tracked workflows: a full sweep, and a tick between sweeps.

Workers call `advance` every few seconds per partition; between the hourly sweeps it should look
only at workflows with an open finding or a release. Prints numbers; asserts nothing.
Run: `python bench/bench_advance.py [--workflows N]`.
"""

from __future__ import annotations

import argparse
import time

from bench_engine import _event

from detector import gc_tuning
from detector.contracts.events import parse_event_json
from detector.core import Detector


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workflows", type=int, default=200_000)
    args = ap.parse_args()
    gc_tuning.tune()
    detector = Detector()
    for w in range(args.workflows):
        wf = f"tenant-{w % 97}/export/{w:07d}"
        acquired = _event(2 * w, "lease_acquired", wf, 1, "worker-1", 1, source="coordinator")
        detector.observe(parse_event_json(acquired))
        detector.observe(parse_event_json(_event(2 * w + 1, "heartbeat", wf, 1, "worker-1", 2)))
    # The latest time the history reports (what the removed global `watermark` was).
    now = max((st.last_at or 0.0 for st in detector.states.values()), default=0.0)
    t0 = time.perf_counter()
    detector.advance(now)  # the first advance of a detector sweeps every workflow
    t1 = time.perf_counter()
    detector.advance(now + 5.0)
    t2 = time.perf_counter()
    print(f"workflows: {len(detector.states):,}")
    print(f"advance, full sweep:            {1000 * (t1 - t0):,.1f} ms")
    print(f"advance, tick between sweeps:   {1000 * (t2 - t1):,.3f} ms")


if __name__ == "__main__":
    main()
