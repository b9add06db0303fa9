"""Job-queue log lines (`job_claimed job=8f1b token=42 worker=w1 seq=3`) as event mappings.

The first bare word is the kind; `key=value` pairs follow, values optionally double-quoted.
`attrs.X=` and `detail.X=` fill those objects. Integers are converted here because the event
model is strict about integer fields (a JSON string is not an epoch).
"""

from __future__ import annotations

import re
from typing import Any, Final

_TOKEN: Final = re.compile(r'\s*([^\s=]+)(?:=("(?:[^"\\]|\\.)*"|\S*))?')
_INTEGER_FIELDS: Final = frozenset({"owner_epoch", "token", "fencing_token", "seq"})
_INT: Final = re.compile(r"-?\d+")


class LogfmtError(ValueError):
    pass


def _value(raw: str) -> str:
    if raw.startswith('"'):
        return re.sub(r"\\(.)", r"\1", raw[1:-1])
    return raw


def parse_logfmt_line(line: str) -> dict[str, Any]:
    """Split one line into an event mapping; raise `LogfmtError` when it is not logfmt."""
    out: dict[str, Any] = {}
    pos, text = 0, line.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise LogfmtError(f"cannot read a key=value pair at column {pos + 1}")
        key, raw = m.group(1), m.group(2)
        pos = m.end()
        if raw is None:
            if "kind" in out:
                raise LogfmtError(
                    f"unexpected bare word {key!r}: the kind is already {out['kind']!r}"
                )
            out["kind"] = key
            continue
        value: Any = _value(raw)
        if key in _INTEGER_FIELDS and _INT.fullmatch(value):
            value = int(value)
        group, _, sub = key.partition(".")
        if sub and group in ("attrs", "detail"):
            out.setdefault(group, {})[sub] = value
        else:
            out[key] = value
    if "kind" not in out:
        raise LogfmtError("no kind: a logfmt event starts with a bare word such as job_claimed")
    return out
