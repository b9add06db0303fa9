"""Job-queue logfmt logs read as ownership events."""

from __future__ import annotations

from ..histories import conds, epochs, logfmt_events, run


def test_job_queue_log_with_rejected_result() -> None:
    events = logfmt_events(
        """
        job_claimed job=8f1b token=41 worker=w1 seq=1 event_id=l1
        heartbeat_ok job=8f1b token=41 worker=w1 seq=2 event_id=l2
        job_claimed job=8f1b token=42 worker=w2 seq=3 event_id=l3
        heartbeat_ok job=8f1b fencing_token=41 owner_id=w1 seq=4 event_id=l4
        tool_request_started job=8f1b token=41 worker=w1 seq=5 event_id=l5 effect_key=upload/8f1b
        result_rejected job=8f1b token=41 worker=w1 seq=6 event_id=l6 source=destination
        heartbeat_lost job=8f1b token=41 worker=w1 seq=7 event_id=l7
        """
    )
    r = run(events)
    f = r.finding("8f1b", 41)
    assert epochs(f) == (41, 42)
    assert f.displaced is not None and f.current is not None
    assert (f.displaced.worker_id, f.current.worker_id) == ("w1", "w2")
    assert conds(f) == [
        ("stale_activity", 4, None),
        ("stale_effect_attempt", 5, None),
        ("stale_effect_rejected", 6, None),
    ]
    assert sorted(f.effect_keys) == ["result", "upload/8f1b"]
    assert f.severity.value == "warning"
    # the attempted upload was never rejected: the sink may have taken it
    assert f.sink_outcome == "attempted"
    # heartbeat_lost is not a condition; fenced, but neither key is verified
    assert f.status.value == "open"


def test_job_queue_log_clean_handoff_and_buffered_line() -> None:
    events = logfmt_events(
        """
        job_claimed job=q7 token=1 worker=w1 seq=1
        heartbeat_ok job=q7 token=1 worker=w1 seq=2
        heartbeat_lost job=q7 token=1 worker=w1 seq=3
        job_claimed job=q7 token=2 worker=w2 seq=5
        heartbeat_ok job=q7 token=2 worker=w2 seq=6
        heartbeat_ok job=q7 token=1 worker=w1 seq=4
        """
    )
    assert [e.kind.value for e in events[:3]] == ["lease_acquired", "heartbeat", "lease_lost"]
    r = run(events)
    assert r.findings() == []


def test_job_queue_log_stale_worker_after_takeover() -> None:
    events = logfmt_events(
        """
        job_claimed job=q9 token=7 worker=w1 seq=1 attrs.tool_class=llm
        job_claimed job=q9 token=8 worker=w2 seq=2 attrs.tool_class=llm
        heartbeat_ok job=q9 token=7 worker=w1 seq=3
        tool_request_started job=q9 token=7 worker=w1 seq=4 effect_key=reply/123
        """
    )
    f = run(events).finding("q9", 7)
    assert f.severity.value == "warning"
    assert conds(f) == [("stale_activity", 3, None), ("stale_effect_attempt", 4, None)]
