"""Signs of life: what ends a displaced owner's silence, so that its quiet period starts again
(DESIGN §4 "Time and silence")."""

from __future__ import annotations

from typing import Final

from detector.contracts.events import Kind

from ._records import EventRecord, Latest, extend
from ._rules import STALE_CONDITION, acquisition, after_takeover
from ._state import Episode, WorkflowState

_UNCERTAIN: Final = Kind.OWNERSHIP_UNCERTAIN.value


def restart_silence(workflow: WorkflowState, ev: EventRecord, at: float | None) -> list[Episode]:
    """A displaced owner heard from after the takeover is alive: its silence starts again
    (DESIGN §4 "Time and silence"). Unsure of its lease, it is no fence either."""
    if workflow.uncertain is None:
        workflow.uncertain = {}
    workflow.uncertain[ev.epoch] = extend(workflow.uncertain.get(ev.epoch), ev)
    episode = workflow.episodes.get((ev.epoch, False))
    if episode is None:
        return []
    if at is not None:
        episode.last_stale_at = at
    return [episode]


def signs_of_life(workflow: WorkflowState) -> dict[int, Latest]:
    """`audit`'s final word on each displaced epoch's signs of life besides evidence: those
    heard as they came, and every retained one now that the history's owners are all known (a
    verification may come before the acquisition that names its epoch's worker)."""
    heard = dict(workflow.uncertain or {})
    for ev in workflow.evidence:
        if heard_from(workflow, ev):
            heard[ev.epoch] = extend(heard.get(ev.epoch), ev)
    return heard


def heard_from(workflow: WorkflowState, ev: EventRecord) -> bool:
    """Is the event, not itself evidence, a sign of life of a displaced owner after the
    takeover (DESIGN §4 "Time and silence")?"""
    return (
        ev.kind not in STALE_CONDITION
        and ev.epoch < workflow.top
        and is_sign_of_life(workflow, ev)
        and after_takeover(workflow, ev)
    )


def is_sign_of_life(workflow: WorkflowState, ev: EventRecord) -> bool:
    """Is the event a sign of life of its epoch's owner, besides evidence? Its doubt about the
    lease, whoever sends it, or any other event that carries its epoch and its worker (a
    verification it sends included): either ends its silence (DESIGN §4 "Time and silence")."""
    if ev.kind == _UNCERTAIN:
        return True
    acq = acquisition(workflow, ev.epoch)
    if acq is not None:
        return acq.worker_id == ev.worker_id
    episode = workflow.episodes.get((ev.epoch, False))
    return episode is not None and episode.worker == ev.worker_id
