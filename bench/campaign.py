"""The fault-injection campaign (issue 34): per source, a real coordination system and a fleet
of workers under a seeded nemesis; findings from a real `splitbrain worker`, read as a downstream
consumer reads them, matched against ground truth written down at each effect.

Run: `python bench/campaign.py --source leases --runs 30 --seed 1 --json campaign.json`
(`--source` repeats; `all` is every source but kubernetes, which needs the built kube-apiserver).
Prints the table: true and false positives, misses, misgraded findings, blind spots (what the
adapter cannot show by design, counted apart), recall and the time from a stale effect to its
finding. The same seed replays the same schedule. Exit status 1 when a source has a false
positive, a miss or a misgraded finding; the campaign asserts nothing else.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from detector.testing.campaign.driver import campaign
from detector.testing.campaign.report import machine, summary, table, write_json
from detector.testing.campaign.sources import SOURCES, load

EVERY = [s for s in SOURCES if s != "kubernetes"]


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/campaign.py", description=__doc__.split("\n")[0])
    parser.add_argument("--source", action="append", choices=[*SOURCES, "all"], required=True)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--workdir", type=Path, help="logs and data (default: a temp dir)")
    parser.add_argument("--bootstrap", help="use this broker (not restarted by the nemesis)")
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(n for s in args.source for n in (EVERY if s == "all" else [s])))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="splitbrain-campaign-"))
    commit = _commit()
    print(f"commit {commit}; {machine()}; seed {args.seed}; workdir {workdir}", flush=True)
    rows = []
    for name in names:
        source = load(name)
        missing = source.missing()
        if missing is not None:
            print(f"campaign: --source {name}: {missing}", file=sys.stderr)
            return 2
        result = campaign(
            source,
            runs=args.runs,
            seed=args.seed,
            workdir=workdir / name,
            bootstrap=args.bootstrap,
            say=lambda line: print(line, flush=True),
        )
        rows.append(summary(result))
    print(table(rows))
    if args.json is not None:
        write_json(args.json, rows, commit)
    bad = any(r["false_positives"] or r["false_negatives"] or r["misgraded"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
