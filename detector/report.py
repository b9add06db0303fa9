"""The words a person reads: the witness of a finding and the report lines `audit`, `tail` and
`replay` print. Every user string in them may be anything an emitter sent, so each line is
escaped before it is printed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from detector.contracts.events import AUTHORITY_ATTR, EPOCH_FROM_ATTR
from detector.contracts.findings import Finding, Owner

_VERB: Final = {
    "stale_activity": "was still active",
    "stale_effect_attempt": "attempted {k}",
    "stale_effect_committed": "had {k} committed",
    "stale_effect_rejected": "had {k} rejected",
}


def _at(seq: int | None, event_id: str) -> str:
    return f"at seq {seq} ({event_id})" if seq is not None else f"({event_id}, by arrival)"


def witness(f: Finding) -> str:
    """The minimal proof in plain words: the transition, then the stale events after it."""
    parts: list[str] = []
    stale = [c for c in f.conditions if c.kind.value.startswith("stale_")]
    dups = [c for c in f.conditions if c.kind.value == "duplicate_effect"]
    if f.displaced is not None and f.current is not None and f.transition is not None:
        opening = (
            f"{f.displaced.worker_id} lost epoch {f.displaced.owner_epoch} to a takeover "
            f"{_at(f.transition.seq, f.transition.event_id)} (now {f.current.worker_id}, "
            f"epoch {f.current.owner_epoch})"
        )
        if stale:
            acts = ", ".join(
                f"{_VERB[c.kind.value].format(k=c.effect_key)} {_at(c.seq, c.event_id)}"
                for c in stale
            )
            opening += f"; after that it {acts}"
        parts.append(opening + ".")
    for d in dups:
        epochs = " and ".join(str(e) for e in d.epochs or [])
        how = "under epochs" if d.cause == "failover" else "twice under epoch"
        parts.append(f"{d.effect_key} was committed {how} {epochs} {_at(d.seq, d.event_id)}.")
    return " ".join(parts)


def context_sides(f: Finding) -> list[tuple[str, str]]:
    """The finding's `context` (DESIGN §5), one (what it is of, "key=value, …") per side that
    has one: the source system's words for the work and its owners, then how far the epoch is
    trusted and where it came from (what an adapter adds to every event). Not yet escaped."""
    ctx = f.context
    if ctx is None:
        return []
    sides = (
        (_of_owner("displaced owner", f.displaced), ctx.displaced),
        ("latest condition", ctx.latest_condition),
        (_of_owner("current owner", f.current), ctx.current),
    )
    return [
        (label, ", ".join(f"{k}={v}" for k, v in sorted(side.items(), key=_trust_last)))
        for label, side in sides
        if side
    ]


def _trust_last(entry: tuple[str, str]) -> bool:
    return entry[0] in _TRUST_ATTRS


_TRUST_ATTRS: Final = frozenset({AUTHORITY_ATTR, EPOCH_FROM_ATTR})


def _of_owner(label: str, owner: Owner | None) -> str:
    return label if owner is None else f"{label} (epoch {owner.owner_epoch})"


def context_text(f: Finding) -> str:
    """The finding's `context` on one line ("" without one). Not yet escaped."""
    return "; ".join(f"{label}: {words}" for label, words in context_sides(f))


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# C0 and C1 controls, DEL, Unicode line and paragraph separators and bidi overrides: a terminal
# or a reader acts on them, so a crafted workflow key could forge, hide or reorder report lines.
_UNPRINTABLE: Final = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def printable(text: str) -> str:
    """`text` with each control character escaped as in a Python literal (`\\n`, `\\x1b`), and
    each lone surrogate (a byte of a history line that is not UTF-8): every line `audit` and
    `tail` print goes through it, since any user string may be in it."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def finding_lines(findings: Iterable[Finding]) -> list[str]:
    """Each finding, worst first: what is still acting, the witness, the conditions and what to
    do. Not yet escaped: the caller prints each line through `printable`."""
    out: list[str] = []
    for f in sorted(findings, key=lambda f: (-f.severity.rank, f.workflow_key)):
        displaced = (
            f"epoch {f.displaced.owner_epoch} ({f.displaced.worker_id}) still acting"
            if f.displaced
            else "one owner committed twice"
        )
        truncated = ", evidence truncated" if f.evidence_truncated else ""
        out.append("")
        out.append(f"{f.severity.value.upper():8} {f.workflow_key}: {displaced}")
        out.append(
            f"  {f.finding_id} rev {f.revision}, {f.status.value}, confidence {f.confidence}"
            f"{truncated}, ordering {f.ordering}, sink {f.sink_outcome}"
        )
        out.append(f"  witness: {witness(f)}")
        for c in f.conditions:
            extra = f" {c.effect_key}" if c.effect_key else ""
            extra += f" cause={c.cause}" if c.cause else ""
            seq = "-" if c.seq is None else str(c.seq)
            out.append(f"    seq {seq:>6}  {c.event_id:<12} {c.kind.value}{extra}")
        if f.conditions_omitted:
            out.append(f"    … and {count(f.conditions_omitted, 'more condition')}")
        for label, words in context_sides(f):
            out.append(f"  context of the {label}: {words}")
        out.append(f"  response: {f.response}")
    return out
