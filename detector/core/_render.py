"""Turn an episode into the published `splitbrain.finding/v1` document, with operator guidance.

Rendering reads only the episode's bounded lists and counters, so a revision costs the same for
the first condition and the ten-thousandth. Bounded lists are not bounded bytes (keys of 512
characters, which JSON may escape six-fold): `_fit` keeps every revision under 64 KiB.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from detector.contracts.findings import (
    Condition,
    ConditionKind,
    EventRef,
    EvidenceLag,
    Finding,
    FindingContext,
    Owner,
    Severity,
    StaleEventRef,
)

from ._context import Context, as_dict
from ._episode import SHOWN_KEYS, outcome, rejected, shown
from ._records import AcquisitionRecord, ConditionRecord, EventRecord, in_order
from ._rules import (
    acquisition,
    current_owner_before,
    displacing,
    worker_of,
)
from ._state import Cut, Episode, WorkflowState

SEVERITY_OF: Final = {
    ConditionKind.STALE_ACTIVITY: Severity.INFO,
    ConditionKind.STALE_EFFECT_REJECTED: Severity.WARNING,
    ConditionKind.STALE_EFFECT_ATTEMPT: Severity.WARNING,
    ConditionKind.STALE_EFFECT_COMMITTED: Severity.CRITICAL,
    ConditionKind.DUPLICATE_EFFECT: Severity.CRITICAL,
}
# Rising severity, as DESIGN §4 lists them: the last present one drives the response.
_RANK: Final = {kind: i for i, kind in enumerate(ConditionKind)}
_COMMITTING: Final = frozenset(
    {ConditionKind.STALE_EFFECT_COMMITTED, ConditionKind.DUPLICATE_EFFECT}
)
_KEYS_IN_RESPONSE: Final = 3
# Cuts that can change any finding of the workflow, not only the one whose evidence they cut.
_WORKFLOW_CUTS: Final = Cut.ACQUISITIONS | Cut.EFFECT_KEYS | Cut.ENGINE_ERROR


def severity_of(cond: ConditionRecord) -> Severity:
    if cond.kind is ConditionKind.DUPLICATE_EFFECT and cond.cause == "retry":
        return Severity.WARNING
    return SEVERITY_OF[cond.kind]


def finding_id(workflow_key: str, epoch: int, retry: bool) -> str:
    """Stable across restarts and workers: a digest of (workflow, displaced epoch[, retry])."""
    raw = f"{workflow_key}\x00{epoch}\x00{'retry' if retry else 'failover'}".encode()
    return "sb-" + hashlib.blake2b(raw, digest_size=10).hexdigest()


def _owner(acq: AcquisitionRecord | None, fallback_worker: str | None, epoch: int) -> Owner | None:
    if acq is not None:
        return Owner(worker_id=acq.worker_id, owner_epoch=acq.epoch)
    if fallback_worker is not None:
        return Owner(worker_id=fallback_worker, owner_epoch=epoch)
    return None


def _sink_outcome(
    ep: Episode, conds: list[ConditionRecord]
) -> Literal["committed", "attempted", "rejected", "none"]:
    kinds = {c.kind for c in conds}  # every kind the episode has is listed at least once
    if kinds & _COMMITTING:
        return "committed"
    if ep.unanswered:
        return "attempted"
    return "rejected" if ConditionKind.STALE_EFFECT_REJECTED in kinds else "none"


def _confidence(
    ep: Episode, authoritative: bool, truncated: bool
) -> Literal["high", "medium", "low"]:
    # A finding with no effect condition needs only the order; one with effects needs every
    # commit and rejection confirmed by a destination (a worker's word on an attempt is not).
    effects = bool(ep.keys) or ep.keys_over > 0
    from_destination = not effects or (ep.confirmations > 0 and ep.unconfirmed == 0)
    score = int(authoritative) + int(from_destination)
    if truncated:
        score = min(score, 1)
    return ("low", "medium", "high")[score]


def _who(owner: Owner | None, fallback: str) -> str:
    return f"{owner.worker_id} (epoch {owner.owner_epoch})" if owner else fallback


def _listing(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} and {keys[-1]}"


def _keys(ep: Episode, first: str, listed: list[str]) -> tuple[dict[str, list[str]], str]:
    """At most a few of the finding's listed keys by what happened to each, those of `first`
    (its highest condition's) first; and a note of how many more the finding holds."""
    by: dict[str, list[str]] = {first: [], "committed": [], "attempted": [], "rejected": []}
    for key in listed:
        by[outcome(ep.keys.get(key, 0))].append(key)
    named: dict[str, list[str]] = {}
    room = _KEYS_IN_RESPONSE
    for what, keys in by.items():
        if keys and room:
            named[what] = keys[:room]
            room -= len(named[what])
    more = len(ep.keys) + ep.keys_over - sum(map(len, named.values()))
    return named, f" (and {more} more effect key{'s' if more > 1 else ''})" if more else ""


def _retry_owners(top: ConditionRecord, now: str) -> str:
    epoch = f" (epoch {top.epochs[0]})" if top.epochs else ""
    workers = top.workers or ()
    if len(workers) == 2 and workers[0] != workers[1]:
        return f"once by {workers[0]} and once by {workers[1]}{epoch}"
    return f"twice by {workers[-1]}{epoch}" if workers else f"twice by {now}"


def _entitled(current: Owner | None) -> str:
    """The sentence that names the finding's `current` owner as the one now entitled to act
    (DESIGN §5); none when no owner is known."""
    return "" if current is None else f" {_who(current, '')} is the owner now entitled to act."


def _response(
    top: ConditionRecord,
    ep: Episode,
    listed: list[str],
    displaced: Owner | None,
    current: Owner | None,
) -> str:
    """What to do and to whom: every response names `current`, when known, as the owner now
    entitled to act; a duplicate's also names the owners of its own commits."""
    who = _who(displaced, "the worker")
    now = _who(current, "the current owner")
    if top.kind is ConditionKind.DUPLICATE_EFFECT:
        if top.cause == "retry":
            return (
                f"{top.effect_key} was committed {_retry_owners(top, now)}: check the "
                "destination's idempotency key, treat the outcome as uncertain until it is "
                f"verified, and do not retry it again.{_entitled(current)}"
            )
        # Named from the duplicate's own commits, not from whoever holds the lease now; then
        # whoever does (a later epoch than either commit's, after another takeover).
        owners = [
            f"{w} (epoch {e})" for w, e in zip(top.workers or (), top.epochs or (), strict=False)
        ]
        pair = " and ".join(owners) if owners else f"{who} and {now}"
        if current is not None:
            retry = f"do not auto-retry {now}, the owner now entitled to act."
        else:
            retry = f"do not auto-retry {owners[-1] if owners else now}."
        return (
            f"{top.effect_key} was committed under two owners ({pair}). Treat the outcome as "
            f"uncertain until an external check or a human verifies it; {retry}"
        )
    return _stale_response(top, ep, listed, who, now) + _entitled(current)


def _stale_response(
    top: ConditionRecord, ep: Episode, listed: list[str], who: str, now: str
) -> str:
    if top.kind is ConditionKind.STALE_ACTIVITY:
        return (
            f"Stop or quarantine {who}; it lost the lease to {now} but is still working. "
            "Check it emits nothing more."
        )
    first = {
        ConditionKind.STALE_EFFECT_COMMITTED: "committed",
        ConditionKind.STALE_EFFECT_ATTEMPT: "attempted",
        ConditionKind.STALE_EFFECT_REJECTED: "rejected",
    }[top.kind]
    named, more = _keys(ep, first, listed)
    main = _listing(named[first]) if named.get(first) else "the affected effects"
    also = "".join(
        f"; {_ALSO[what]} {_listing(keys)}" for what, keys in named.items() if what != first
    )
    if top.kind is ConditionKind.STALE_EFFECT_COMMITTED:
        return (
            f"The fence failed or did not exist: {who} committed {main} after {now} took "
            f"over{also}{more}. Freeze later effects, inspect the result, and decide whether "
            "compensation is safe."
        )
    if top.kind is ConditionKind.STALE_EFFECT_ATTEMPT:
        return (
            f"Freeze {main}{also}{more}. {who} tried to act after losing the lease to {now}: "
            "find out whether the destination enforces the fencing token."
        )
    return (
        f"The fence held: keep the rejection receipt for {main}{also}{more}. Find out why "
        f"{who} missed its lease loss, and check that {now} still progresses."
    )


# How a response names keys other than those of its highest condition.
_ALSO: Final = {
    "committed": "it committed",
    "attempted": "it attempted",
    "rejected": "the destination rejected",
}


def _transition_of(
    state: WorkflowState, ep: Episode, cond: ConditionRecord
) -> AcquisitionRecord | None:
    """What displaced a condition's witness: the earliest acquisition of a higher epoch before
    it (for a duplicate after a clean handoff, the handoff); none when nothing did."""
    return displacing(state, ep.displaced_epoch, cond)


def _witness(
    state: WorkflowState, ep: Episode, conds: list[ConditionRecord]
) -> tuple[ConditionRecord, AcquisitionRecord | None, bool]:
    """The condition a finding names first, its transition, and whether the order is
    authoritative (DESIGN §4): the first listed condition placed after its own transition by
    `seq` (for a retry, which has no transition: one whose two commits both carry `seq`); with
    none, the first listed condition, placed by arrival."""
    if ep.retry:
        placed = next((c for c in conds if c.by_seq), None)
        return (conds[0], None, False) if placed is None else (placed, None, True)
    first: tuple[ConditionRecord, AcquisitionRecord | None] | None = None
    for c in conds:
        tr = _transition_of(state, ep, c)
        if c.seq is not None and tr is not None and tr.seq is not None and tr.seq <= c.seq:
            return c, tr, True
        if first is None:
            first = (c, tr)
    assert first is not None
    return first[0], first[1], False


def _effect_keys(ep: Episode, top: ConditionRecord, conds: list[ConditionRecord]) -> list[str]:
    """The keys a revision lists: those of its highest condition first (DESIGN §5), then the
    episode's first keys, sorted; at most `SHOWN_KEYS`."""
    kind = (top.kind, top.cause)
    mine = sorted(
        {c.effect_key for c in conds if (c.kind, c.cause) == kind and c.effect_key is not None}
    )
    if not mine:
        return list(ep.shown)
    return [*mine, *(k for k in ep.shown if k not in set(mine))][:SHOWN_KEYS]


def render(workflow_key: str, state: WorkflowState, ep: Episode, revision: int) -> Finding:
    return _fit(_document(workflow_key, state, ep, revision))


def _document(workflow_key: str, state: WorkflowState, ep: Episode, revision: int) -> Finding:
    conds = in_order(shown(ep), lambda c: _RANK[c.kind])
    latest = None if ep.latest is None else ep.latest.latest
    fallback = ep.worker or worker_of(state, ep.displaced_epoch)
    displaced: Owner | None = None
    if not ep.retry:
        acquired = acquisition(state, ep.displaced_epoch)
        displaced = _owner(acquired, fallback, ep.displaced_epoch)
        if acquired is not None:
            # Shown from here on, even once the acquisition is forgotten at its cap.
            ep.displaced_ctx = acquired.ctx
    # The highest epoch acquired before the latest condition; none acquired: null.
    now = None if latest is None else current_owner_before(state, latest)
    current = _owner(now, None, ep.displaced_epoch)
    witness, transition, authoritative = _witness(state, ep, conds)
    if conds[0] is not witness:
        conds.remove(witness)
        conds.insert(0, witness)  # the witness names a condition placed by seq first
    # An attempt whose key a destination then rejected is settled: the fence held.
    open_conds = [
        c
        for c in conds
        if c.kind is not ConditionKind.STALE_EFFECT_ATTEMPT
        or c.effect_key is None
        or not rejected(ep.keys.get(c.effect_key, 0))
    ] or conds
    top = max(open_conds, key=lambda c: (severity_of(c).rank, _RANK[c.kind]))
    listed = _effect_keys(ep, top, conds)
    tracked = len(ep.keys) + ep.keys_over
    last = ep.last_stale
    truncated = (
        ep.truncated
        or bool(state.cut & _WORKFLOW_CUTS)
        or (not ep.retry and ep.displaced_epoch < state.blind_below)
    )
    return Finding(
        finding_id=finding_id(workflow_key, ep.displaced_epoch, ep.retry),
        revision=revision,
        status=ep.status,
        severity=ep.severity,
        workflow_key=workflow_key,
        displaced=displaced,
        current=current,
        transition=None
        if transition is None
        else EventRef(event_id=transition.event_id, seq=transition.seq),
        conditions=[
            Condition(
                kind=c.kind,
                event_id=c.event_id,
                seq=c.seq,
                effect_key=c.effect_key,
                cause=c.cause,
                epochs=None if c.epochs is None else list(c.epochs),
            )
            for c in conds
        ],
        last_stale_event=None
        if last is None
        else StaleEventRef(event_id=last.event_id, seq=last.seq, kind=last.kind),
        effect_keys=listed,
        sink_outcome=_sink_outcome(ep, conds),
        ordering="authoritative_seq" if authoritative else "arrival",
        confidence=_confidence(ep, authoritative, truncated),
        evidence_lag=_lag(transition, last),
        response=_response(top, ep, listed, displaced, current),
        trace_links=[c.trace for c in conds if c.trace is not None],
        evidence_truncated=truncated,
        conditions_omitted=max(ep.total - len(conds), 0),
        effect_keys_omitted=tracked - len(listed),
        context=_context(
            None if ep.retry else ep.displaced_ctx,
            None if latest is None else latest.ctx,
            None if now is None else now.ctx,
        ),
    )


def _context(
    displaced: Context | None, latest: Context | None, current: Context | None
) -> FindingContext | None:
    """The finding's `context` (DESIGN §5), from the records' own: bounded when they were made
    (`_context`), so a revision shows them as they are. None when every side is empty."""
    if not (displaced or latest or current):
        return None
    return FindingContext(
        displaced=as_dict(displaced), latest_condition=as_dict(latest), current=as_dict(current)
    )


def _lag(transition: AcquisitionRecord | None, last: EventRecord | None) -> EvidenceLag | None:
    if transition is None or last is None:
        return None
    seq = None if last.seq is None or transition.seq is None else last.seq - transition.seq
    seconds = None if last.obs is None or transition.obs is None else last.obs - transition.obs
    return EvidenceLag(
        seq=None if seq is None or seq < 0 else seq,
        seconds=None if seconds is None or seconds < 0 else seconds,
    )


# ---- the byte cap (DESIGN §4 "Retention": every revision stays under 64 KiB encoded) ---------

MAX_REVISION_BYTES: Final = 60 * 1024  # the JSON document; the rest of 64 KiB is the envelope
_CUT_CHARS: Final = 64  # what a cut effect key keeps, then "…"
_CUT_RESPONSE_CHARS: Final = 1024
_ESCAPED: Final = 6  # the most bytes one character takes in JSON (`\u0000`)
_PER_ITEM: Final = 256  # bytes of a condition or reference besides its strings, at most
_FIXED: Final = 2048


def _bound(f: Finding) -> int:
    """An upper bound of the encoded size, without encoding: almost every finding is far below
    the cap, and this is all it costs them."""
    owners = [o.worker_id for o in (f.displaced, f.current) if o is not None]
    refs = [r.event_id for r in (f.transition, f.last_stale_event) if r is not None]
    chars = (
        len(f.workflow_key)
        + len(f.response)
        + sum(map(len, f.effect_keys))
        + sum(len(c.event_id) + len(c.effect_key or "") for c in f.conditions)
        + sum(map(len, (*owners, *refs, *f.trace_links)))
    )
    items = len(f.conditions) + len(f.effect_keys) + len(f.trace_links)
    ctx = f.context
    if ctx is not None:
        for side in (ctx.displaced, ctx.latest_condition, ctx.current):
            if side:
                chars += sum(len(k) + len(v) for k, v in side.items())
                items += 1
    return _ESCAPED * chars + _PER_ITEM * items + _FIXED


def _size(f: Finding) -> int:
    return len(f.to_json().encode())


def _cut(value: str, chars: int) -> str:
    return value if len(value) <= chars else value[:chars] + "…"


def _fit(f: Finding) -> Finding:
    """Keep a revision under the cap. First long effect keys and the response are cut (the
    finding then says its evidence is cut: `evidence_truncated`, never `high`); then the lists
    shed their last entries, counted as omitted, down to the first condition of each kind."""
    if _bound(f) <= MAX_REVISION_BYTES or _size(f) <= MAX_REVISION_BYTES:
        return f
    conditions = [
        c
        if c.effect_key is None or len(c.effect_key) <= _CUT_CHARS
        else c.model_copy(update={"effect_key": _cut(c.effect_key, _CUT_CHARS)})
        for c in f.conditions
    ]
    f = f.model_copy(
        update={
            "conditions": conditions,
            "effect_keys": [_cut(k, _CUT_CHARS) for k in f.effect_keys],
            "response": _cut(f.response, _CUT_RESPONSE_CHARS),
            "evidence_truncated": True,
            "confidence": "medium" if f.confidence == "high" else f.confidence,
        }
    )
    while _bound(f) > MAX_REVISION_BYTES and _size(f) > MAX_REVISION_BYTES:
        firsts: dict[tuple[str, str | None], Condition] = {}
        for c in f.conditions:
            firsts.setdefault((c.kind.value, c.cause), c)
        others = [c for c in f.conditions if all(c is not k for k in firsts.values())]
        keys = f.effect_keys
        if not others and not keys:
            if f.context is not None:  # the source's words go before the finding's own
                f = f.model_copy(update={"context": None})
                continue
            break  # what is left is bounded far below the cap
        kept_others = others[: len(others) // 2]
        dropped = set(map(id, others[len(kept_others) :]))
        kept_keys = keys[: len(keys) // 2]
        conds = [c for c in f.conditions if id(c) not in dropped]
        f = f.model_copy(
            update={
                "conditions": conds,
                "effect_keys": kept_keys,
                "conditions_omitted": f.conditions_omitted + len(dropped),
                "effect_keys_omitted": f.effect_keys_omitted + len(keys) - len(kept_keys),
            }
        )
    return f
