"""What carrying its witness events would cost a finding, in bytes (ADR 0006, the findings view).

For every history of examples/ (or those given), each finding's latest revision as published,
and beside it: the events it references (its transition and conditions) as compact JSON, and the
events `audit --html` draws around its episode. The view draws from the finding alone; these
are the bytes a finding would grow by if it carried either set instead.

python bench/bench_view_events.py [HISTORY ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from detector.histories.audit import audit_lines
from detector.histories.window import EventWindows
from detector.timeline import draw

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def measure(history: Path) -> list[tuple[str, int, int, int, int]]:
    windows = EventWindows()
    with history.open("rb") as lines:
        result = audit_lines(lines, windows=windows)
    rows = []
    for f in result.findings.values():
        seen, _ = windows.events(f.workflow_key)
        drawn = {p.event_id for p in draw(f, seen).points}
        referenced = {c.event_id for c in f.conditions}
        if f.transition is not None:
            referenced.add(f.transition.event_id)
        size = {s.event.event_id: len(s.event.model_dump_json(exclude_none=True)) for s in seen}
        rows.append(
            (
                f.workflow_key,
                len(f.to_json()),
                sum(size.get(e, 0) for e in referenced),
                sum(size.get(e, 0) for e in drawn),
                len(drawn),
            )
        )
    return rows


def main(argv: list[str]) -> int:
    histories = [Path(a) for a in argv] or sorted(
        p for p in EXAMPLES.iterdir() if p.suffix in (".jsonl", ".log")
    )
    print("history | workflow | finding B | + referenced events B | + drawn window B (events)")
    for history in histories:
        for key, finding, referenced, window, events in measure(history):
            print(f"{history.name} | {key} | {finding} | {referenced} | {window} ({events})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
