"""Turn an episode into the published `splitbrain.finding/v1` document, with operator guidance."""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from detector.events import Source
from detector.findings import (
    Condition,
    ConditionKind,
    EventRef,
    EvidenceLag,
    Finding,
    Owner,
    Severity,
    StaleEventRef,
)

from ._records import Acq, Cond, Ev, order_key
from ._rules import acquisition, current_owner_before, transition_of, worker_of
from ._state import Episode, WorkflowState

SEVERITY_OF: Final = {
    ConditionKind.STALE_ACTIVITY: Severity.INFO,
    ConditionKind.STALE_EFFECT_REJECTED: Severity.WARNING,
    ConditionKind.STALE_EFFECT_ATTEMPT: Severity.WARNING,
    ConditionKind.STALE_EFFECT_COMMITTED: Severity.CRITICAL,
    ConditionKind.DUPLICATE_EFFECT: Severity.CRITICAL,
}
# Rising severity, as DESIGN §4 lists them: the last present one drives the response.
_RANK: Final = {kind: i for i, kind in enumerate(ConditionKind)}
_EFFECT_CONFIRMATIONS: Final = frozenset(
    {
        ConditionKind.STALE_EFFECT_COMMITTED,
        ConditionKind.STALE_EFFECT_REJECTED,
        ConditionKind.DUPLICATE_EFFECT,
    }
)


def severity_of(cond: Cond) -> Severity:
    if cond.kind is ConditionKind.DUPLICATE_EFFECT and cond.cause == "retry":
        return Severity.WARNING
    return SEVERITY_OF[cond.kind]


def finding_id(workflow_key: str, epoch: int, retry: bool) -> str:
    """Stable across restarts and workers: a digest of (workflow, displaced epoch[, retry])."""
    raw = f"{workflow_key}\x00{epoch}\x00{'retry' if retry else 'failover'}".encode()
    return "sb-" + hashlib.blake2b(raw, digest_size=10).hexdigest()


def _owner(acq: Acq | None, fallback_worker: str | None, epoch: int) -> Owner | None:
    if acq is not None:
        return Owner(worker_id=acq.worker_id, owner_epoch=acq.epoch)
    if fallback_worker is not None:
        return Owner(worker_id=fallback_worker, owner_epoch=epoch)
    return None


def _sink_outcome(conds: list[Cond]) -> Literal["committed", "attempted", "rejected", "none"]:
    kinds = {c.kind for c in conds}
    if kinds & {ConditionKind.STALE_EFFECT_COMMITTED, ConditionKind.DUPLICATE_EFFECT}:
        return "committed"
    if any(_unanswered_attempt(c, conds) for c in conds):
        return "attempted"
    return "rejected" if ConditionKind.STALE_EFFECT_REJECTED in kinds else "none"


def _unanswered_attempt(cond: Cond, conds: list[Cond]) -> bool:
    """An attempt whose effect a destination then rejected is settled: the fence held."""
    return cond.kind is ConditionKind.STALE_EFFECT_ATTEMPT and not any(
        c.kind is ConditionKind.STALE_EFFECT_REJECTED and c.effect_key == cond.effect_key
        for c in conds
    )


def _confidence(conds: list[Cond], authoritative: bool) -> Literal["high", "medium", "low"]:
    confirmations = [c for c in conds if c.kind in _EFFECT_CONFIRMATIONS]
    from_destination = bool(confirmations) and all(
        c.source == Source.DESTINATION for c in confirmations
    )
    score = int(authoritative) + int(from_destination)
    return ("low", "medium", "high")[score]


def _response(top: Cond, displaced: Owner | None, current: Owner | None, keys: list[str]) -> str:
    who = f"{displaced.worker_id} (epoch {displaced.owner_epoch})" if displaced else "the worker"
    now = f"{current.worker_id} (epoch {current.owner_epoch})" if current else "the current owner"
    effects = ", ".join(keys) if keys else "the affected effects"
    if top.kind is ConditionKind.DUPLICATE_EFFECT and top.cause == "retry":
        return (
            f"{effects} was committed twice by {now}: check the destination's idempotency key, "
            "treat the outcome as uncertain until it is verified, and do not retry it again."
        )
    return {
        ConditionKind.STALE_ACTIVITY: (
            f"Stop or quarantine {who}; it lost the lease to {now} but is still working. "
            "Check it emits nothing more."
        ),
        ConditionKind.STALE_EFFECT_REJECTED: (
            f"The fence held: keep the rejection receipt for {effects}. Find out why {who} "
            f"missed its lease loss, and check that {now} still progresses."
        ),
        ConditionKind.STALE_EFFECT_ATTEMPT: (
            f"Freeze {effects}. {who} tried to act after losing the lease to {now}: find out "
            "whether the destination enforces the fencing token."
        ),
        ConditionKind.STALE_EFFECT_COMMITTED: (
            f"The fence failed or did not exist: {who} committed {effects} after {now} took "
            "over. Freeze later effects, inspect the result, and decide whether compensation "
            "is safe."
        ),
        ConditionKind.DUPLICATE_EFFECT: (
            f"{effects} was committed under two owners ({who} and {now}). Treat the outcome as "
            "uncertain until an external check or a human verifies it; do not auto-retry "
            f"{now}."
        ),
    }[top.kind]


def render(workflow_key: str, state: WorkflowState, ep: Episode, revision: int) -> Finding:
    conds = sorted(ep.conditions.values(), key=lambda c: (order_key(c), _RANK[c.kind]))
    # The latest evidence of the episode: a repeated condition keeps its earliest witness, but
    # the stale event after it still tells who held the lease by then.
    latest: Cond | Ev = conds[-1]
    if ep.last_stale is not None and order_key(ep.last_stale) > order_key(latest):
        latest = ep.last_stale
    if ep.retry:
        displaced = None
        owner = current_owner_before(state, latest) or acquisition(state, ep.displaced_epoch)
        current = _owner(
            owner, ep.worker or worker_of(state, ep.displaced_epoch), ep.displaced_epoch
        )
        transition = None
    else:
        displaced = _owner(
            acquisition(state, ep.displaced_epoch),
            ep.worker or worker_of(state, ep.displaced_epoch),
            ep.displaced_epoch,
        )
        trans = transition_of(state, ep.displaced_epoch)
        cur = current_owner_before(state, latest) or trans
        current = _owner(cur, None, ep.displaced_epoch)
        transition = trans
    keys = sorted({c.effect_key for c in conds if c.effect_key is not None})
    authoritative = all(c.seq is not None for c in conds) and (
        transition is None or transition.seq is not None
    )
    open_conds = [
        c
        for c in conds
        if c.kind is not ConditionKind.STALE_EFFECT_ATTEMPT or _unanswered_attempt(c, conds)
    ]
    top = max(open_conds, key=lambda c: (severity_of(c).rank, _RANK[c.kind]))
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
        if ep.last_stale is None
        else StaleEventRef(
            event_id=ep.last_stale.event_id, seq=ep.last_stale.seq, kind=ep.last_stale.kind
        ),
        effect_keys=keys,
        sink_outcome=_sink_outcome(conds),
        ordering="authoritative_seq" if authoritative else "arrival",
        confidence=_confidence(conds, authoritative),
        evidence_lag=_lag(transition, ep.last_stale or latest),
        response=_response(top, displaced, current, keys),
        trace_links=[c.trace for c in conds if c.trace is not None],
    )


def _lag(transition: Acq | None, last: Ev | Cond) -> EvidenceLag | None:
    if transition is None:
        return None
    seq = None if last.seq is None or transition.seq is None else last.seq - transition.seq
    last_obs = last.obs if isinstance(last, Ev) else None
    seconds = None if last_obs is None or transition.obs is None else last_obs - transition.obs
    return EvidenceLag(seq=seq, seconds=seconds)
