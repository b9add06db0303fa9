"""Order: seq, arrival order and late-buffered evidence."""

from __future__ import annotations

from ..histories import K, W, acq, commit, conds, ev, run, takeover


def test_late_buffered_pre_takeover_evidence_raises_nothing() -> None:
    # alpha's checkpoint, attempt and commit all happened before the takeover (seq < 5) but were
    # buffered and only arrive after beta's acquisition.
    r = run(
        [
            *takeover(),
            ev("p", "progress", W, 17, "alpha", seq=2),
            ev("hb", "heartbeat", W, 17, "alpha", seq=3),
            ev("x", "effect_attempted", W, 17, "alpha", seq=3, key=K),
            commit("c", 17, "alpha", 4),
            ev("rj", "effect_rejected", W, 17, "alpha", seq=4, key="other", source="destination"),
        ]
    )
    assert r.findings() == []
    assert r.updates == []


def test_arrival_order_fallback_without_seq_has_lower_confidence() -> None:
    r = run([*takeover(seq=False), ev("p", "progress", W, 17, "alpha")])
    f = r.finding(W, 17)
    # no effect condition: the order alone decides, and arrival is the weaker one
    assert (f.ordering, f.confidence) == ("arrival", "medium")
    assert conds(f) == [("stale_activity", None, None)]

    r = run([*takeover(seq=False), commit("c", 17, "alpha", None)])
    f = r.finding(W, 17)
    assert (f.ordering, f.confidence, f.severity.value) == ("arrival", "medium", "critical")


def test_arrival_order_when_only_one_side_has_seq() -> None:
    r = run([*takeover(), commit("c", 17, "alpha", None)])
    f = r.finding(W, 17)
    assert f.ordering == "arrival"
    assert f.confidence == "medium"


def test_arrival_order_event_before_acquisition_is_not_stale() -> None:
    r = run([acq("a17", 17, "alpha"), ev("p", "progress", W, 17, "alpha"), acq("a18", 18, "beta")])
    assert r.findings() == []


def test_acquisition_arriving_after_the_stale_events_it_displaces_still_finds_them() -> None:
    stale = [
        ev("p", "progress", W, 17, "alpha", seq=6),
        ev("x", "effect_attempted", W, 17, "alpha", seq=7, key=K),
        commit("c17", 17, "alpha", 8),
    ]
    late = run([acq("a17", 17, "alpha", 1), *stale, acq("a18", 18, "beta", 5)])
    in_order = run([*takeover(), *stale])
    f, g = late.finding(W, 17), in_order.finding(W, 17)
    assert conds(f) == [
        ("stale_activity", 6, None),
        ("stale_effect_attempt", 7, None),
        ("stale_effect_committed", 8, None),
    ]
    assert f.model_dump(exclude={"revision"}) == g.model_dump(exclude={"revision"})
