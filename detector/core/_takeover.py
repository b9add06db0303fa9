"""Late acquisitions: what one displaces among the events the workflow still holds, and which
findings one may rename (their displaced owner, transition or current owner, DESIGN §4)."""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import itemgetter
from typing import Final

from ._conditions import add_stale
from ._reach import NEVER, Reach
from ._records import (
    ACQUISITION,
    AcquisitionRecord,
    EventRecord,
    after,
    any_after,
    before,
    raw_acquisition,
)
from ._rules import STALE_CONDITION, after_takeover, current_owner_before
from ._silence import is_sign_of_life, restart_silence
from ._state import Episode, EpisodeKey, WorkflowState

# Findings an acquisition looks at one by one (`_moved_by`) before they get a `Reach`: most
# workflows have one or two, and a trie per workflow would cost more memory than it saves time.
SCAN_FINDINGS: Final = 8
_SEQ: Final = itemgetter(EventRecord._fields.index("seq"))


def displace(
    workflow: WorkflowState,
    acquisition: AcquisitionRecord,
    at: float | None,
    uncertain: bool,
    max_keys: int,
) -> list[Episode]:
    """A late acquisition: what it displaces among what the workflow still holds. Only the
    events no acquisition displaced yet are looked at, each once: what was already stale
    stays so, and its condition is already counted."""
    touched: list[Episode] = []
    undisplaced = workflow.undisplaced
    reach = workflow.undisplaced_reach
    if undisplaced is not None and reach is not None and acquisition.seq is not None:
        # Only the epochs below it that hold an event at or after its seq: not every epoch.
        for epoch in sorted(reach.report(acquisition.epoch - 1, acquisition.seq)):
            kept = undisplaced[epoch]
            i = bisect_left(kept, acquisition.seq, key=_SEQ)  # at the takeover's seq: after it
            tail = kept[i:]
            del kept[i:]
            for ev in tail:
                if not before(acquisition, ev):
                    kept.append(ev)
                elif ev.kind in STALE_CONDITION:
                    touched.append(add_stale(workflow, ev, at, uncertain, max_keys))
                else:
                    touched.extend(restart_silence(workflow, ev, at))
            if kept:
                reach.set(epoch, epoch, kept[-1].seq or 0)
            else:
                del undisplaced[epoch]
                reach.discard(epoch)
    if workflow.forgotten is not None and any_after(
        workflow.forgotten, acquisition.seq, acquisition.pos, ACQUISITION
    ):
        # Raw events after it are gone: the latest effects per key still tell, but other
        # stale events and earlier witnesses may be among what was forgotten.
        if acquisition.epoch > workflow.blind_below:
            # The findings of the epochs it newly blinds say their evidence may be cut:
            # a new revision each, published now (never a document changed in silence).
            for episode in workflow.episodes.values():
                if (
                    not episode.retry
                    and workflow.blind_below <= episode.displaced_epoch < acquisition.epoch
                ):
                    episode.changes += 1
                    touched.append(episode)
            workflow.blind_below = acquisition.epoch
        for effect in (workflow.effects or {}).values():
            for (epoch, _), ev in list(effect.lasts.items()):
                if epoch < acquisition.epoch and before(acquisition, ev):
                    touched.append(add_stale(workflow, ev, at, uncertain, max_keys))
    return touched


def index_undisplaced(workflow: WorkflowState) -> None:
    """The retained events with `seq` that the acquisitions known so far do not displace, the
    acquisitions themselves among them (`raw_acquisition`)."""
    workflow.undisplaced = {}
    workflow.undisplaced_reach = Reach()
    for ev in workflow.evidence:
        keep_undisplaced(workflow, ev)
    for acquisition in workflow.acqs:
        keep_undisplaced(workflow, raw_acquisition(acquisition))


def keep_undisplaced(workflow: WorkflowState, ev: EventRecord) -> None:
    """Keep `ev` for a later acquisition to displace, unless one already does."""
    undisplaced = workflow.undisplaced
    assert undisplaced is not None
    if (
        ev.seq is None
        or (ev.kind not in STALE_CONDITION and not is_sign_of_life(workflow, ev))
        or after_takeover(workflow, ev)
    ):
        return
    kept = undisplaced.get(ev.epoch)
    if kept is None:
        kept = undisplaced[ev.epoch] = [ev]
    elif ev.seq >= (kept[-1].seq or 0):  # every kept event has a seq
        kept.append(ev)  # in order, as most are
    else:
        insort(kept, ev, key=_SEQ)
        return  # its latest seq is the same
    reach = workflow.undisplaced_reach
    if reach is not None:
        reach.set(ev.epoch, ev.epoch, ev.seq)


def renamed(
    workflow: WorkflowState, acquisition: AcquisitionRecord, threshold: int
) -> list[Episode]:
    """The findings an acquisition may rename (their owners, their transition): its own
    epoch's, and those below its epoch whose conditions reach `threshold` (its seq when it
    is late, `reach_of`); after everything else, none but its own."""
    found = workflow.found
    if not found:
        return []
    if workflow.reach is None and len(found) <= SCAN_FINDINGS:
        return [episode for episode in found.values() if _moved_by(episode, acquisition)]
    moved = [found[k] for k in reach_of(workflow).report(acquisition.epoch, threshold)]
    own = found.get((acquisition.epoch, False))
    if own is not None:
        moved.append(own)
    return [episode for episode in moved if _moved_by(episode, acquisition)]


def reach_of(workflow: WorkflowState) -> Reach[EpisodeKey]:
    """The workflow's findings by what a late acquisition must be to change them (built at
    the first acquisition that finds more than `SCAN_FINDINGS`, then kept as findings
    change: `Settler.settle_all`)."""
    reach = workflow.reach
    if reach is None:
        reach = workflow.reach = Reach()
        for episode in workflow.episodes.values():
            place(workflow, reach, episode)
    return reach


def place(workflow: WorkflowState, reach: Reach[EpisodeKey], episode: Episode) -> None:
    """Where a late acquisition must be to change the finding (DESIGN §4: its displaced owner,
    transition and current owner are chosen among the acquisitions): at or below its key, at or
    before its value. The key is its displaced epoch (a transition is of a higher epoch); when its
    current owner is below that (or none is known), -1, so that any epoch may rename it. The
    value is its latest condition's seq: a late acquisition after every condition renames
    nothing (each condition's transition is an acquisition before it)."""
    latest = episode.latest
    top = None if latest is None else latest.top
    value = NEVER if top is None or top.seq is None else top.seq
    key = episode.displaced_epoch
    last = None if latest is None else latest.latest
    current = None if last is None else current_owner_before(workflow, last)
    if current is None or current.epoch < key:
        key = -1
    reach.set(episode.key, key, value)


def _moved_by(episode: Episode, acquisition: AcquisitionRecord) -> bool:
    """Could an acquisition (kept already) rename this finding's displaced owner, its transition
    or its current owner? Not when none of the events that triggered its conditions comes after
    it: `current` and each condition's transition are chosen among the acquisitions before
    them. Asked of the whole set (`Latest`), not of its latest member alone: with `seq` on some
    events only, an acquisition after the latest by arrival can be before another by `seq`."""
    if episode.displaced_epoch == acquisition.epoch:
        return True
    return episode.latest is None or after(episode.latest, acquisition)
