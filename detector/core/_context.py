"""A finding's `context` (DESIGN §5): the source system's own words for the work and its owners,
from an event's `attrs` and `detail`, kept with the event's record.

A context is one immutable tuple of (key, value) string pairs, bounded when it is made: at most
`MAX_ENTRIES`, `attrs` first then `detail`, each sorted by key (a `detail` key already given in
`attrs` is left out), every key and value at most `MAX_CHARS` characters (a longer one is cut and
ends in "…"). A `detail` value that is no string is written as JSON writes it (`1`, `true`,
`null`, `1.5`); a nested object or list as compact JSON with sorted keys, cut like any other.
Equal contexts are one shared object (most events of a fleet carry the same few: a task name,
an attempt number), as `_labels` shares labels; an event without `attrs` and `detail` has none
(`None`), and costs nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from sys import intern
from typing import Any, Final

from detector.contracts.findings import MAX_CONTEXT_CHARS, MAX_CONTEXT_ENTRIES

Context = tuple[tuple[str, str], ...]

MAX_ENTRIES: Final = MAX_CONTEXT_ENTRIES
MAX_CHARS: Final = MAX_CONTEXT_CHARS
# Distinct contexts kept for sharing; when full, the table starts again (what was shared stays
# shared: records keep their objects).
_SHARED_MAX: Final = 4096
_SHARED: Final[dict[Context, Context]] = {}
# The contexts of `attrs` and `detail` as events give them (flat ones only), for the hot path.
_MADE: Final[dict[tuple[Any, ...], Context | None]] = {}


def cut(text: str, chars: int = MAX_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _text(value: Any) -> str:
    """A `detail` value as JSON writes it; scalars without the JSON encoder (most values)."""
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is bool:
        return "true" if value else "false"
    if kind is int or (kind is float and math.isfinite(value)):
        return repr(value)
    if value is None:
        return "null"
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):  # not from JSON: never raised into the engine
        return repr(value)


def share(ctx: Context) -> Context:
    """The one shared object equal to `ctx`."""
    found = _SHARED.get(ctx)
    if found is not None:
        return found
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    _SHARED[ctx] = ctx
    return ctx


def _make(attrs: Mapping[str, str] | None, detail: Mapping[str, Any] | None) -> Context | None:
    entries: dict[str, str] = {}
    for source in (attrs, detail):
        if not source:
            continue
        for key in sorted(source):
            if len(entries) >= MAX_ENTRIES:
                break
            name = cut(str(key))
            if name not in entries:
                entries[name] = cut(_text(source[key]))
    if not entries:
        return None
    return share(tuple((intern(k), v) for k, v in entries.items()))


def context_of(attrs: Mapping[str, str] | None, detail: Mapping[str, Any] | None) -> Context | None:
    """The bounded, shared context of an event's `attrs` and `detail` (None without either)."""
    if not attrs and not detail:
        return None
    try:
        # With the values' types: 1, 1.0 and true are equal keys, not equal words.
        raw = (
            tuple(attrs.items()) if attrs else (),
            tuple(detail.items()) if detail else (),
            tuple(map(type, detail.values())) if detail else (),
        )
        made = _MADE.get(raw)
    except TypeError:  # a nested `detail`: made each time
        return _make(attrs, detail)
    if made is None and raw not in _MADE:
        made = _make(attrs, detail)
        if len(_MADE) >= _SHARED_MAX:
            _MADE.clear()
        _MADE[raw] = made
    return made


def context_row(row: Iterable[Iterable[str]] | None) -> Context | None:
    """A context as a state holds it (pairs as arrays), shared again."""
    if row is None:
        return None
    pairs = tuple((intern(str(k)), str(v)) for k, v in row)
    return share(pairs) if pairs else None


def as_dict(ctx: Context | None) -> dict[str, str] | None:
    return None if not ctx else dict(ctx)
