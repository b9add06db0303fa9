"""Job-queue log lines (`job_claimed job=8f1b token=42 worker=w1 seq=3`) as event mappings.

The first bare word is the kind; `key=value` pairs follow, values optionally double-quoted.
`attrs.X=` and `detail.X=` fill those objects. Integers are converted here because the event
model is strict about integer fields (a JSON string is not an epoch).

A line that says one thing twice and differently (a key repeated, `kind=` against the bare
word, `attrs=` against `attrs.X=`), or whose quote never closes, is refused: picking one of the
two would be a silent choice (DESIGN §3). Aliases of one field (`job=` and `workflow_key=`) are
compared by `detector.contracts.events`, for JSON and logfmt alike.
"""

from __future__ import annotations

import re
from typing import Any, Final

from detector.contracts.events import KIND_ALIASES
from detector.errors import SplitbrainError

_TOKEN: Final = re.compile(r'\s*([^\s=]+)(?:=(?:("(?:[^"\\]|\\.)*")|(\S*)))?')
_INTEGER_FIELDS: Final = frozenset({"owner_epoch", "token", "fencing_token", "seq"})
_INT: Final = re.compile(r"-?\d+")
_OBJECTS: Final = ("attrs", "detail")


class LogfmtError(SplitbrainError, ValueError):
    pass


def _unquote(quoted: str) -> str:
    return re.sub(r"\\(.)", r"\1", quoted[1:-1])


def _same(key: str, old: Any, new: Any) -> bool:
    """Equal values; kinds compare by meaning, so `job_claimed kind=lease_acquired` agrees."""
    if key == "kind":
        return bool(KIND_ALIASES.get(old, old) == KIND_ALIASES.get(new, new))
    return bool(old == new)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _put(target: dict[str, Any], key: str, value: Any, name: str) -> None:
    if key not in target:
        target[key] = value
    elif not _same(key, target[key], value):
        raise LogfmtError(
            f"{name} given twice with different values ({_show(target[key])} and {_show(value)})"
        )


def parse_logfmt_line(line: str) -> dict[str, Any]:
    """Split one line into an event mapping; raise `LogfmtError` when it is not logfmt."""
    out: dict[str, Any] = {}
    pos, text, bare = 0, line.strip(), False
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise LogfmtError(f"cannot read a key=value pair at column {pos + 1}")
        key, quoted, plain = m.groups()
        if plain is not None and plain.startswith('"'):
            raise LogfmtError(
                f"unterminated quote in the value of {key} at column {m.start(1) + 1}"
            )
        pos = m.end()
        if quoted is None and plain is None:
            if bare:
                raise LogfmtError(f"unexpected bare word {key!r}: the kind is {out['kind']!r}")
            bare = True
            _put(out, "kind", key, "kind")
            continue
        value: Any = plain if quoted is None else _unquote(quoted)
        if key in _INTEGER_FIELDS and _INT.fullmatch(value):
            value = int(value)
        group, _, sub = key.partition(".")
        if group in _OBJECTS and isinstance(out.get(group), str if sub else dict):
            raise LogfmtError(f"{group} given both as {group}= and as {group}.X=")
        if sub and group in _OBJECTS:
            _put(out.setdefault(group, {}), sub, value, key)
        else:
            _put(out, key, value, key)
    if "kind" not in out:
        raise LogfmtError("no kind: a logfmt event starts with a bare word such as job_claimed")
    return out
