"""Escalation and revisions: one revision per change, severity never lowered."""

from __future__ import annotations

from ..histories import K, W, commit, ev, run, takeover


def test_escalation_publishes_one_revision_per_change_and_never_lowers_severity() -> None:
    r = run([*takeover(), ev("hb", "heartbeat", W, 17, "alpha", seq=7)])
    r.feed([ev("x", "effect_attempted", W, 17, "alpha", seq=8, key=K)])
    r.feed([commit("c", 17, "alpha", 9)])
    # an earlier stale checkpoint arrives late: a new (earlier) witness, severity stays critical
    r.feed([ev("p", "progress", W, 17, "alpha", seq=6)])
    revs = r.revisions(r.finding(W, 17).finding_id)
    assert [(f.revision, f.severity.value) for f in revs] == [
        (1, "info"),
        (2, "warning"),
        (3, "critical"),
        (4, "critical"),
    ]
    assert revs[-1].conditions[0].event_id == "p"
    stale = revs[-1].last_stale_event
    assert stale is not None and stale.event_id == "c"
    assert len({f.finding_id for f in revs}) == 1


def test_nothing_new_publishes_no_revision() -> None:
    r = run([*takeover(), commit("c", 17, "alpha", 8)])
    before = len(r.updates)
    # the current owner's routine work and a pre-takeover checkpoint change nothing
    r.feed(
        [
            ev("hb18", "heartbeat", W, 18, "beta", seq=9),
            ev("p18", "progress", W, 18, "beta", seq=10),
            ev("old", "progress", W, 17, "alpha", seq=2),
        ]
    )
    assert len(r.updates) == before
    assert r.finding(W, 17).revision == 1
