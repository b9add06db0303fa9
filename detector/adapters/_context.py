"""Who owns the work the current task or activity is doing, for the user's own effect calls.

An adapter sets the ownership around the task it watches (`owning`); code inside it calls
`effect_attempted`, `effect_committed`, `effect_rejected` or `progress` and the event carries the
workflow key and epoch without the user passing them. Outside any ownership those calls emit
nothing and return False: there is no owner to name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from detector.contracts.events import (
    AUTHORITY_ATTR,
    EPOCH_FROM_ATTR,
    MAX_DETAIL_BYTES,
    Kind,
    Source,
)

from ._sink import AdapterSink, owner_fields


class Authority(StrEnum):
    """How far an epoch can be trusted (ADAPTERS.md's A, B and C), carried in `attrs`."""

    SYSTEM = "system"  # assigned by the system, grows per key, and the system fences on it
    APPROXIMATE = "approximate"  # assigned by the system, but approximate, resettable or unfenced
    MINTED = "minted"  # minted by the adapter (a counter, a clock): advisory


# A word's value is cut to this many characters: the finding's `context` keeps 128 (DESIGN §5).
WORD_CHARS: Final = 128

Word = str | int | float | bool


def words(**given: Word | None) -> dict[str, Word]:
    """The source system's own words for an owner (DESIGN §5 `context`): names and scalars, None
    left out, a text cut to `WORD_CHARS`. Never a payload, a prompt or a tool's response."""
    return {
        k: v[:WORD_CHARS] if isinstance(v, str) else v for k, v in given.items() if v is not None
    }


@dataclass(frozen=True, slots=True)
class Ownership:
    """One owner of one unit of work, as an adapter saw it acquired."""

    sink: AdapterSink
    workflow_key: str
    owner_epoch: int
    worker_id: str
    authority: Authority
    epoch_from: str  # where the epoch came from, e.g. `temporal.attempt` (a bounded label)
    attrs: Mapping[str, str] = field(default_factory=dict)
    # The source's own words for this owner (`words`: a task or activity name, an attempt, a
    # lease's name): in the `detail` of every event of it, under the event's own detail, so a
    # finding's `context` reads in them (DESIGN §5). Replaced whole by `note`, never mutated.
    words: Mapping[str, Word] = field(default_factory=dict)
    # The fields every event of this owner carries, built once
    _fields: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = owner_fields(self.workflow_key, self.owner_epoch, self.worker_id, self._attrs())
        object.__setattr__(self, "_fields", fields)

    def _attrs(self) -> dict[str, str]:
        return {
            **self.attrs,
            AUTHORITY_ATTR: str(self.authority),  # its value, without `.value`'s two frames
            EPOCH_FROM_ATTR: self.epoch_from,
        }

    def note(self, **more: Word | None) -> None:
        """Add words for this owner's later events (e.g. that it outlived its lease, by its own
        clock): from any thread, each event reads either the old words or the new."""
        object.__setattr__(self, "words", {**self.words, **words(**more)})

    def _worded(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`fields` with the owner's words under the event's own `detail` (which wins a name
        both give). A user's detail that the words would push past the contract's 4 KiB is sent
        as it was: the words never cost an event."""
        said = self.words
        if not said:
            return fields
        own = fields.get("detail")
        if not own:
            fields["detail"] = dict(said)
            return fields
        merged = {**said, **own}
        if len(json.dumps(merged, default=str)) > MAX_DETAIL_BYTES:  # ASCII-escaped: the most
            return fields
        fields["detail"] = merged
        return fields

    def emit(self, kind: Kind, **fields: Any) -> None:
        """Send one event of this owner, with fields the adapter made (its dict built in the
        sink's sender, off the caller's thread); never raises into the caller."""
        self.sink.send_owned(self._fields, kind, self._worded(fields))

    def effect(
        self,
        kind: Kind,
        effect_key: str,
        source: Source,
        seq: int | None,
        destination: str | None,
        detail: Mapping[str, Any] | None,
    ) -> None:
        """An effect of this owner placed in the coordinator's order at `seq` (an adapter's
        read or write there; None: by arrival)."""
        self.emit(
            kind,
            effect_key=effect_key,
            destination=destination,
            source=source,
            seq=seq,
            detail=detail,
        )

    def checked(self, kind: Kind, **fields: Any) -> None:
        """Send one event of this owner with fields from the user's code, validated in full."""
        fields = self._worded(fields)
        self.sink.send(
            kind,
            workflow_key=self.workflow_key,
            owner_epoch=self.owner_epoch,
            worker_id=self.worker_id,
            attrs=self._attrs(),
            **fields,
        )

    def acquired(self, **fields: Any) -> None:
        """The acquisition: a coordinator's only when the system assigned and fences the epoch;
        a minted or approximate epoch is the worker's word (DESIGN §4: no claimed authority)."""
        source = Source.COORDINATOR if self.authority is Authority.SYSTEM else Source.WORKER
        self.emit(Kind.LEASE_ACQUIRED, source=source, **fields)


_current: ContextVar[Ownership | None] = ContextVar("splitbrain_ownership", default=None)


def current() -> Ownership | None:
    """The ownership the calling code runs under, if an adapter set one."""
    return _current.get()


@contextmanager
def owning(ownership: Ownership) -> Iterator[Ownership]:
    """Run a block as `ownership`: effect calls inside it carry its key and epoch."""
    token = enter(ownership)
    try:
        yield ownership
    finally:
        leave(token)


def enter(ownership: Ownership) -> Token[Ownership | None]:
    """`owning` for a hook that starts the block and another that ends it (a signal pair):
    without a generator's cost per task. `leave` with the token ends it."""
    return _current.set(ownership)


def leave(token: Token[Ownership | None]) -> None:
    _current.reset(token)


def _emit(kind: Kind, **fields: Any) -> bool:
    owner = _current.get()
    if owner is None:
        return False
    owner.checked(kind, **{k: v for k, v in fields.items() if v is not None})
    return True


def effect_attempted(
    effect_key: str, *, destination: str | None = None, detail: Mapping[str, Any] | None = None
) -> bool:
    """About to cross a side-effect boundary (`effect_key` names the visible result)."""
    return _emit(
        Kind.EFFECT_ATTEMPTED, effect_key=effect_key, destination=destination, detail=detail
    )


def effect_committed(
    effect_key: str,
    *,
    destination: str | None = None,
    detail: Mapping[str, Any] | None = None,
    by_destination: bool = False,
) -> bool:
    """The effect happened. A worker's word unless `by_destination`: the destination's own
    receipt (DESIGN §3: only a destination's commit is authoritative)."""
    return _emit(
        Kind.EFFECT_COMMITTED,
        effect_key=effect_key,
        destination=destination,
        detail=detail,
        source=Source.DESTINATION if by_destination else Source.WORKER,
    )


def effect_rejected(
    effect_key: str,
    *,
    destination: str | None = None,
    detail: Mapping[str, Any] | None = None,
    by_destination: bool = True,
) -> bool:
    """The destination refused the effect (e.g. a stale fence): the rejection receipt."""
    return _emit(
        Kind.EFFECT_REJECTED,
        effect_key=effect_key,
        destination=destination,
        detail=detail,
        source=Source.DESTINATION if by_destination else Source.WORKER,
    )


def progress(detail: Mapping[str, Any] | None = None) -> bool:
    """A checkpoint of the current owner."""
    return _emit(Kind.PROGRESS, detail=detail)
