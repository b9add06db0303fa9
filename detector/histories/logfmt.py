"""Job-queue log lines (`job_claimed job=8f1b token=42 worker=w1 seq=3`) as event mappings.

The first bare word is the kind; `key=value` pairs follow, values optionally double-quoted.
`attrs.X=` and `detail.X=` fill those objects. The value of a numeric field is a number only
when it is written as JSON writes one (DESIGN §3: ASCII digits, an optional leading minus, no
leading zero, an optional fraction and exponent), and it is then read by the JSON parser that
reads the wire, so `token=1.0` and `"token": 1.0` are one thing. Any other value (a fullwidth
or Arabic-Indic digit, `seq=+1`, `seq=1_000`, `seq=007`, `lease_duration_s=NaN`) stays a string,
which the event model refuses as it refuses a JSON string there, naming the field: a required
one (the epoch) costs the line, an optional one is dropped and reported.

A line that says one thing twice and differently (a key repeated, `kind=` against the bare
word, `attrs=` against `attrs.X=`), or whose quote never closes, is refused: picking one of the
two would be a silent choice (DESIGN §3). A name given twice and differently inside `attrs` or
`detail` costs only that object, which is dropped and reported like any invalid optional field.
Aliases of one field (`job=` and `workflow_key=`) are compared by `detector.contracts.events`,
for JSON and logfmt alike.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic_core import from_json

from detector.contracts.events import KIND_ALIASES, FieldDrop
from detector.errors import SplitbrainError

_TOKEN: Final = re.compile(r'\s*([^\s=]+)(?:=(?:("(?:[^"\\]|\\.)*")|(\S*)))?')
# The event's numeric fields, under every name a line may give them (DESIGN §3).
_NUMBER_FIELDS: Final = frozenset(
    {"owner_epoch", "token", "fencing_token", "seq", "lease_duration_s", "heartbeat_interval_s"}
)
# A number as JSON (RFC 8259) writes one: `[0-9]`, never `\d`, which matches any Unicode digit.
_JSON_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
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


def parse_logfmt_line(line: str) -> tuple[dict[str, Any], tuple[FieldDrop, ...]]:
    """Split one line into an event mapping and the objects left out of it (an `attrs` or
    `detail` that gives a name twice); raise `LogfmtError` when it is not logfmt."""
    out: dict[str, Any] = {}
    drops: dict[str, FieldDrop] = {}
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
        if key in _NUMBER_FIELDS and _JSON_NUMBER.fullmatch(value):
            value = from_json(value)  # an int or a float exactly as the wire's parser reads it
        group, _, sub = key.partition(".")
        if group in _OBJECTS and isinstance(out.get(group), str if sub else dict):
            raise LogfmtError(f"{group} given both as {group}= and as {group}.X=")
        if sub and group in _OBJECTS:
            _put_inside(out.setdefault(group, {}), sub, value, group, drops)
        else:
            _put(out, key, value, key)
    if "kind" not in out:
        raise LogfmtError("no kind: a logfmt event starts with a bare word such as job_claimed")
    for group in drops:
        del out[group]
    return out, tuple(drops.values())


def _put_inside(
    target: dict[str, Any], key: str, value: Any, group: str, drops: dict[str, FieldDrop]
) -> None:
    """`group.key=value`: a name given twice and differently costs the object, not the line."""
    try:
        _put(target, key, value, key)
    except LogfmtError:
        drops.setdefault(group, FieldDrop(group, f"{key}: given twice with different values"))
