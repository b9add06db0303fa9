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
    st: WorkflowState, acq: AcquisitionRecord, at: float | None, uncertain: bool, cap: int
) -> list[Episode]:
    """A late acquisition: what it displaces among what the workflow still holds. Only the
    events no acquisition displaced yet are looked at, each once: what was already stale
    stays so, and its condition is already counted."""
    touched: list[Episode] = []
    und = st.undisplaced
    reach = st.undisplaced_reach
    if und is not None and reach is not None and acq.seq is not None:
        # Only the epochs below it that hold an event at or after its seq: not every epoch.
        for epoch in sorted(reach.report(acq.epoch - 1, acq.seq)):
            kept = und[epoch]
            i = bisect_left(kept, acq.seq, key=_SEQ)  # at the takeover's seq: after it
            tail = kept[i:]
            del kept[i:]
            for ev in tail:
                if not before(acq, ev):
                    kept.append(ev)
                elif ev.kind in STALE_CONDITION:
                    touched.append(add_stale(st, ev, at, uncertain, cap))
                else:
                    touched.extend(restart_silence(st, ev, at))
            if kept:
                reach.set(epoch, epoch, kept[-1].seq or 0)
            else:
                del und[epoch]
                reach.discard(epoch)
    if st.forgotten is not None and any_after(st.forgotten, acq.seq, acq.pos, ACQUISITION):
        # Raw events after it are gone: the latest effects per key still tell, but other
        # stale events and earlier witnesses may be among what was forgotten.
        if acq.epoch > st.blind_below:
            # The findings of the epochs it newly blinds say their evidence may be cut:
            # a new revision each, published now (never a document changed in silence).
            for ep in st.episodes.values():
                if not ep.retry and st.blind_below <= ep.displaced_epoch < acq.epoch:
                    ep.changes += 1
                    touched.append(ep)
            st.blind_below = acq.epoch
        for eff in (st.effects or {}).values():
            for (epoch, _), ev in list(eff.lasts.items()):
                if epoch < acq.epoch and before(acq, ev):
                    touched.append(add_stale(st, ev, at, uncertain, cap))
    return touched


def index_undisplaced(st: WorkflowState) -> None:
    """The retained events with `seq` that the acquisitions known so far do not displace, the
    acquisitions themselves among them (`raw_acquisition`)."""
    st.undisplaced = {}
    st.undisplaced_reach = Reach()
    for ev in st.evidence:
        keep_undisplaced(st, ev)
    for acq in st.acqs:
        keep_undisplaced(st, raw_acquisition(acq))


def keep_undisplaced(st: WorkflowState, ev: EventRecord) -> None:
    """Keep `ev` for a later acquisition to displace, unless one already does."""
    und = st.undisplaced
    assert und is not None
    if (
        ev.seq is None
        or (ev.kind not in STALE_CONDITION and not is_sign_of_life(st, ev))
        or after_takeover(st, ev)
    ):
        return
    kept = und.get(ev.epoch)
    if kept is None:
        kept = und[ev.epoch] = [ev]
    elif ev.seq >= (kept[-1].seq or 0):  # every kept event has a seq
        kept.append(ev)  # in order, as most are
    else:
        insort(kept, ev, key=_SEQ)
        return  # its latest seq is the same
    reach = st.undisplaced_reach
    if reach is not None:
        reach.set(ev.epoch, ev.epoch, ev.seq)


def renamed(st: WorkflowState, acq: AcquisitionRecord, threshold: int) -> list[Episode]:
    """The findings an acquisition may rename (their owners, their transition): its own
    epoch's, and those below its epoch whose conditions reach `threshold` (its seq when it
    is late, `reach_of`); after everything else, none but its own."""
    found = st.found
    if not found:
        return []
    if st.reach is None and len(found) <= SCAN_FINDINGS:
        return [ep for ep in found.values() if _moved_by(ep, acq)]
    moved = [found[k] for k in reach_of(st).report(acq.epoch, threshold)]
    own = found.get((acq.epoch, False))
    if own is not None:
        moved.append(own)
    return [ep for ep in moved if _moved_by(ep, acq)]


def reach_of(st: WorkflowState) -> Reach[EpisodeKey]:
    """The workflow's findings by what a late acquisition must be to change them (built at
    the first acquisition that finds more than `SCAN_FINDINGS`, then kept as findings
    change: `Settler.settle_all`)."""
    reach = st.reach
    if reach is None:
        reach = st.reach = Reach()
        for ep in st.episodes.values():
            place(st, reach, ep)
    return reach


def place(st: WorkflowState, reach: Reach[EpisodeKey], ep: Episode) -> None:
    """Where a late acquisition must be to change the finding (DESIGN §4: its displaced owner,
    transition and current owner are chosen among the acquisitions): at or below its key, at or
    before its value. The key is its displaced epoch (a transition is of a higher epoch); when its
    current owner is below that (or none is known), -1, so that any epoch may rename it. The
    value is its latest condition's seq: a late acquisition after every condition renames
    nothing (each condition's transition is an acquisition before it)."""
    latest = ep.latest
    top = None if latest is None else latest.top
    value = NEVER if top is None or top.seq is None else top.seq
    key = ep.displaced_epoch
    last = None if latest is None else latest.latest
    current = None if last is None else current_owner_before(st, last)
    if current is None or current.epoch < key:
        key = -1
    reach.set(ep.key, key, value)


def _moved_by(ep: Episode, acq: AcquisitionRecord) -> bool:
    """Could an acquisition (kept already) rename this finding's displaced owner, its transition
    or its current owner? Not when none of the events that triggered its conditions comes after
    it: `current` and each condition's transition are chosen among the acquisitions before
    them. Asked of the whole set (`Latest`), not of its latest member alone: with `seq` on some
    events only, an acquisition after the latest by arrival can be before another by `seq`."""
    if ep.displaced_epoch == acq.epoch:
        return True
    return ep.latest is None or after(ep.latest, acq)
