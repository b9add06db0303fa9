"""Work per event does not grow with the history (DESIGN §4 "Retention"): operations counted,
never seconds. Renders are what an event costs most; each is counted where the engine makes one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding
from detector.core import Config, Detector
from detector.core._render import render
from detector.core._takeover import SCAN_FINDINGS

from ..histories import W, acq, commit, ev


def _renders(
    monkeypatch: pytest.MonkeyPatch, events: list[OwnershipEvent], config: Config | None = None
) -> tuple[int, int]:
    """Renders and revisions of an engine fed the history and finished (`audit`'s caps unless
    told otherwise)."""
    made = [0]

    def counted(*args: Any) -> Finding:
        made[0] += 1
        return render(*args)

    with monkeypatch.context() as patched:
        patched.setattr("detector.core._settling.render", counted)
        d = Detector(config or Config.for_audit())
        revisions = sum(len(d.observe(e)) for e in events)
        revisions += len(d.finish())
    return made[0], revisions


def late_newest_first(n: int) -> list[OwnershipEvent]:
    """Epoch i takes over at seq 10i and epoch i-1 commits a key after it (a zombie each); the
    coordinator's acquisitions arrive after every worker's event, newest first."""
    stale = [commit(f"c{i}", i - 1, f"w{i - 1}", 10 * i + 1, key=f"k{i}") for i in range(2, n + 1)]
    acquisitions = [acq(f"a{i}", i, f"w{i}", 10 * i) for i in range(n, 0, -1)]
    return stale + acquisitions


def recommitted(n: int) -> list[OwnershipEvent]:
    out: list[OwnershipEvent] = []
    for e in range(1, n + 1):
        out += [
            acq(f"a{e}", e, f"w{e}", 3 * e),
            commit(f"c{e}", e, f"w{e}", 3 * e + 1),
            ev(f"r{e}", "lease_released", W, e, f"w{e}", seq=3 * e + 2),
        ]
    return out


def zombie_chain(n: int) -> list[OwnershipEvent]:
    out = [acq("a1", 1, "w1", 1)]
    for e in range(2, n + 1):
        out += [acq(f"a{e}", e, f"w{e}", 2 * e), commit(f"c{e - 1}", e - 1, f"w{e - 1}", 2 * e + 1)]
    return out


@pytest.mark.parametrize(
    ("history", "per_event", "config"),
    [
        (late_newest_first, 2, None),
        (recommitted, 1, None),
        (zombie_chain, 1, None),
        (recommitted, 2, Config()),
        (zombie_chain, 3, Config()),
    ],
    ids=[
        "late acquisitions newest first",
        "a key of each owner",
        "a chain of zombies",
        "a key of each owner, a worker's caps",
        "a chain of zombies, a worker's caps",
    ],
)
def test_renders_grow_linearly_with_the_history(
    monkeypatch: pytest.MonkeyPatch,
    history: Callable[[int], list[OwnershipEvent]],
    per_event: int,
    config: Config | None,
) -> None:
    """Under a worker's caps acquisitions and effect keys are pushed out as the history grows:
    the findings that named an acquisition pushed out are rendered again, not every finding of
    the workflow. (Late acquisitions after raw events were forgotten look at each effect key's
    latest events again, at most `max_effect_keys`: bounded by that cap, not linear.)"""
    small, big = history(60), history(180)
    r1, v1 = _renders(monkeypatch, small, config)
    r3, v3 = _renders(monkeypatch, big, config)
    assert r1 <= per_event * len(small) and r3 <= per_event * len(big)
    assert r3 <= 3.3 * r1  # 3x the history, about 3x the renders (quadratic: 9x)
    assert v3 <= 3.3 * v1


def test_late_acquisitions_newest_first_render_each_finding_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 120
    renders, revisions = _renders(monkeypatch, late_newest_first(n))
    assert revisions == n - 1  # one finding per zombie, published once
    # its opening and the acquisition that names its owner; and while a workflow has few
    # findings, an acquisition looks at each of them (`SCAN_FINDINGS`)
    assert renders <= 2 * n + SCAN_FINDINGS**2


@pytest.mark.parametrize("seed", range(20))
def test_acquisitions_inserted_in_place_keep_the_staleness_index_exact(seed: int) -> None:
    """A late acquisition is inserted into the index instead of rebuilding it: the index then
    equals one built from scratch, whatever the epochs, seqs and repeats."""
    import random  # noqa: PLC0415

    from detector.core._rules import _index  # noqa: PLC0415

    rng = random.Random(seed)
    d = Detector(Config.for_audit())
    checked = 0
    for i in range(60):
        epoch = rng.randrange(1, 40)
        seq = None if rng.random() < 0.2 else rng.randrange(200)
        d.observe(acq(f"a{i}", epoch, f"w{epoch}", seq))
        # the first owner's sign of life: the staleness index is asked, so it is held
        d.observe(ev(f"h{i}", "heartbeat", W, 0, "w0", seq=rng.randrange(200)))
        st = d.states[W]
        assert st.index is not None
        kept = tuple(map(list, st.index))
        st.index = None
        assert tuple(map(list, _index(st))) == kept
        checked += 1
    assert checked == 60


@pytest.mark.parametrize("seed", range(10))
def test_reach_reports_exactly_the_items_below_a_key_and_at_or_above_a_value(seed: int) -> None:
    import random  # noqa: PLC0415

    from detector.core._reach import Reach  # noqa: PLC0415

    rng = random.Random(seed)
    reach: Reach[int] = Reach()
    held: dict[int, tuple[int, int]] = {}
    for _ in range(400):
        item, op = rng.randrange(40), rng.random()
        if op < 0.6:
            key = rng.randrange(-1, rng.choice([2, 50, 5000, 2**40]))
            value = rng.randrange(100)
            reach.set(item, key, value)
            held[item] = (key, value)
        elif op < 0.75:
            reach.discard(item)
            held.pop(item, None)
        else:
            key, value = rng.randrange(-2, 6000), rng.randrange(110)
            want = sorted(i for i, (k, v) in held.items() if k <= key and v >= value)
            assert sorted(reach.report(key, value)) == want
    assert len(reach) == len(held)
