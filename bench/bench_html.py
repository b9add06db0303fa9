"""`audit --html` on a large history: time, peak memory and report size, against plain `audit`.

Writes `bench_engine.py`'s mixed history (mostly healthy owners, ~2% planted split-brains) to a
file, then runs `splitbrain audit` on it twice in a fresh process each: without and with
`--html`. Prints wall time, peak RSS (the child's ru_maxrss) and the report's size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_engine import history


def run(args: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one `splitbrain` process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "detector.cli", *args], stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"splitbrain {' '.join(args)} failed")
    return elapsed, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--workflows", type=int, default=20_000)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "history.jsonl")
        path.write_bytes(b"\n".join(history(opts.events, opts.workflows)) + b"\n")
        report = Path(tmp, "report.html")
        print(f"history: {opts.events} events, {opts.workflows} workflows, "
              f"{path.stat().st_size / 1e6:.1f} MB")  # fmt: skip
        plain_s, plain_rss = run(["audit", str(path), "--fail-on", "none"])
        html_s, html_rss = run(["audit", str(path), "--fail-on", "none", "--html", str(report)])
        text = report.read_text()
        drawn = text.count('class="event ')
        listed = text.count('class="finding-row"')
        print(f"audit          {plain_s:7.1f} s  peak RSS {plain_rss / 2**20:7.0f} MiB")
        print(f"audit --html   {html_s:7.1f} s  peak RSS {html_rss / 2**20:7.0f} MiB")
        print(
            f"report: {len(text.encode()) / 1e6:.2f} MB, {listed} findings listed, "
            f"{text.count('<section')} drawn, "
            f"{drawn} events drawn"
        )


if __name__ == "__main__":
    main()
