"""What reading one event costs, and what of it is the check for a field written twice.

`parse_event_json` validates with pydantic's JSON parser, which keeps a repeated key's last value
silently; DESIGN §3 makes such an event malformed, so every event passes `_may_repeat` (a cheap
necessary condition) and the rare one that meets it `_once_each` (exact). Prints µs per event
for the parse as it is, for the same parse with the filter left out (what the parser alone
costs), and how many events took the exact check. Three histories on the common path: the
torture generator's (compact JSON), the same with Python's default separators (`": "`, `", "`),
and the same with every event's `detail` filled. Then the slow paths of events kept without an
optional field (DESIGN §3), each event carrying one: a boolean `lease_duration_s` (validated
again without it), a name given twice inside `detail` (the exact check finds it), and a
`detail` nested 300 deep (refused by the JSON parser, read again member by member). Best of
`--repeat` runs; asserts nothing.
Run: `python bench/bench_parse.py [--events N] [--repeat N]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from detector import gc_tuning
from detector.contracts import events
from detector.testing.torture.history import generate


def _per_event(lines: list[bytes], repeat: int) -> float:
    best = float("inf")
    parse = events.parse_event_json
    for _ in range(repeat):
        started = time.perf_counter()
        for line in lines:
            parse(line)
        best = min(best, time.perf_counter() - started)
    return best / len(lines) * 1e6


_FILTER = "_may_repeat"


def _measure(name: str, lines: list[bytes], repeat: int) -> None:
    real = events._may_repeat
    checked = sum(real(line, events.parse_event_json(line)) for line in lines)
    with_filter = _per_event(lines, repeat)
    setattr(events, _FILTER, lambda raw, event: False)  # what the parser alone costs
    try:
        without = _per_event(lines, repeat)
    finally:
        setattr(events, _FILTER, real)
    print(
        f"{name:<20} parse {with_filter:5.2f} us/event; without the repeat filter "
        f"{without:5.2f}; the filter {with_filter - without:+.2f} us; "
        f"{checked} of {len(lines)} took the exact check"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    gc_tuning.tune()
    print(f"machine: {platform.machine()}, python {platform.python_version()}")
    compact = generate(args.events)
    docs = [json.loads(line) for line in compact]
    spaced = [json.dumps(doc).encode() for doc in docs]
    detailed = [
        json.dumps({**doc, "detail": {"rows": i, "request_id": f"r-{i}"}}).encode()
        for i, doc in enumerate(docs)
    ]
    for name, lines in (
        ("compact", compact),
        ("default separators", spaced),
        ("with detail", detailed),
    ):
        _measure(name, lines, args.repeat)
    few = docs[: max(1, args.events // 10)]  # the slow paths take longer: a tenth of the events
    deep = '{"n": ' * 300 + "1" + "}" * 300
    for name, lines in (
        ("drop: boolean", [json.dumps({**d, "lease_duration_s": True}).encode() for d in few]),
        ("drop: name twice", [_member(d, '"detail": {"n": 1, "n": 2}') for d in few]),
        ("drop: 300 deep", [_member(d, f'"detail": {deep}') for d in few]),
    ):
        dropped = sum(len(events.parse_event_json(line).dropped_fields) for line in lines)
        print(
            f"{name:<20} parse {_per_event(lines, args.repeat):7.2f} us/event; "
            f"{dropped} of {len(lines)} dropped a field"
        )


def _member(doc: dict[str, object], member: str) -> bytes:
    """`doc` as JSON with one more member, written as it is (`json.dumps` writes no repeat)."""
    return f"{json.dumps(doc)[:-1]}, {member}}}".encode()


if __name__ == "__main__":
    main()
