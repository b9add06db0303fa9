"""A finding's `context` (DESIGN §5): the source system's words for the work and its owners, from
the displaced owner's acquisition, the latest condition and the current owner's acquisition."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding
from detector.contracts.page_state import SinkName
from detector.core import Config, decode_state, encode_state
from detector.histories.window import EventWindows
from detector.paging.alertmanager import AlertmanagerSink
from detector.paging.pagerduty import PagerDutySink
from detector.paging.state import Action, Delivery
from detector.report import finding_lines
from detector.timeline import render
from detector.view import pages

from ..histories import acq, commit, ev, run

CELERY = "celery/8f1b-task-id"
TASK = {"task": "myapp.add"}


def celery_history() -> list[OwnershipEvent]:
    """A Celery `acks_late` task: delivery 1 on w1 outlives the visibility timeout, the broker
    redelivers it to w2, and w1's late result still lands (a stale commit)."""
    return [
        acq("d1", 1, "w1", 1, CELERY, attrs=TASK, detail={"delivery": 1}),
        ev("p1", "progress", CELERY, 1, "w1", seq=2),
        acq("d2", 2, "w2", 3, CELERY, attrs=TASK, detail={"cause": "visibility_timeout"}),
        commit("c1", 1, "w1", 4, key="sum/8f1b", wf=CELERY, detail={"rows": 3}),
    ]


def test_a_celery_finding_names_the_task_on_both_sides_and_the_cause() -> None:
    f = run(celery_history()).finding(CELERY, 1)
    assert f.context is not None
    assert f.context.displaced == {"task": "myapp.add", "delivery": "1"}
    assert f.context.current == {"task": "myapp.add", "cause": "visibility_timeout"}
    assert f.context.latest_condition == {"rows": "3"}
    doc = json.loads(f.to_json())
    assert doc["context"] == {
        "displaced": {"task": "myapp.add", "delivery": "1"},
        "latest_condition": {"rows": "3"},
        "current": {"task": "myapp.add", "cause": "visibility_timeout"},
    }


def test_a_temporal_finding_says_attempt_1_and_attempt_2_of_one_worker() -> None:
    wf = "temporal/wf-7/activity-3"
    f = run(
        [
            acq("t1", 1, "host-1@4242", 1, wf, attrs={"activity": "charge"}, detail={"attempt": 1}),
            acq("t2", 2, "host-1@4242", 4, wf, attrs={"activity": "charge"}, detail={"attempt": 2}),
            ev("hb", "heartbeat", wf, 1, "host-1@4242", seq=5),
        ]
    ).finding(wf, 1)
    assert f.displaced is not None and f.current is not None
    assert f.displaced.worker_id == f.current.worker_id
    assert f.context is not None
    assert f.context.displaced == {"activity": "charge", "attempt": "1"}
    assert f.context.current == {"activity": "charge", "attempt": "2"}
    assert f.context.latest_condition is None  # the heartbeat says nothing: the side is left out
    assert "latest_condition" not in json.loads(f.to_json())["context"]


def test_without_attrs_or_detail_the_field_is_absent() -> None:
    events = [acq("a1", 1, "w1", 1), acq("a2", 2, "w2", 2), commit("c", 1, "w1", 3)]
    f = run(events).findings()[0]
    assert f.context is None
    assert "context" not in json.loads(f.to_json())


def test_the_context_does_not_depend_on_arrival_order_with_seq() -> None:
    # The stale commit may arrive before the acquisition that displaces it (a late acquisition):
    # its context travels with its retained record.
    events = celery_history()
    seen = set()
    for order in itertools.permutations(events):
        f = run(list(order)).finding(CELERY, 1)
        seen.add(None if f.context is None else f.context.model_dump_json())
    assert len(seen) == 1
    assert seen.pop() == run(events).finding(CELERY, 1).context.model_dump_json()  # type: ignore[union-attr]


def test_the_latest_condition_is_the_latest_by_seq_whatever_the_arrival() -> None:
    wf = "wf-latest"
    a1 = acq("a1", 1, "w1", 1, wf)
    a2 = acq("a2", 2, "w2", 2, wf)
    early = commit("c1", 1, "w1", 3, key="k1", wf=wf, detail={"step": "first"})
    late = commit("c2", 1, "w1", 9, key="k2", wf=wf, detail={"step": "last"})
    for order in ([a1, a2, early, late], [late, early, a1, a2], [a1, late, early, a2]):
        f = run(order).finding(wf, 1)
        assert f.context is not None
        assert f.context.latest_condition == {"step": "last"}


def test_at_most_16_entries_attrs_first_and_values_of_at_most_128_characters() -> None:
    attrs = {f"a{i:02}": f"v{i}" for i in range(10)}
    detail = {f"d{i:02}": i for i in range(10)} | {
        "b-long": "x" * 300,
        "b-nested": {"z": [1, 2], "y": True},
        "a00": "shadowed by attrs",
        "b" + "k" * 200: False,
    }
    f = run(
        [
            acq("a1", 1, "w1", 1, attrs=attrs, detail=detail),
            acq("a2", 2, "w2", 2),
            commit("c", 1, "w1", 3),
        ]
    ).findings()[0]
    assert f.context is not None and f.context.displaced is not None
    side = f.context.displaced
    assert len(side) == 16
    assert list(side)[:10] == sorted(attrs)  # attrs first, sorted
    assert side["a00"] == "v0"  # a detail key given in attrs is left out
    assert side["b-long"] == "x" * 127 + "…"
    assert side["b-nested"] == '{"y":true,"z":[1,2]}'
    long_key = "b" + "k" * 126 + "…"
    assert side[long_key] == "false"
    assert all(len(k) <= 128 and len(v) <= 128 for k, v in side.items())
    assert list(side)[10:] == sorted(side)[10:]  # then detail, sorted by key
    assert f.context.current is None


def test_the_context_survives_a_state_round_trip_and_is_shared() -> None:
    r = run(celery_history())
    before = r.finding(CELERY, 1)
    st = r.detector.states[CELERY]
    restored = decode_state(encode_state(st))
    assert restored == st
    assert restored.acqs[0].ctx == (("task", "myapp.add"), ("delivery", "1"))
    again = decode_state(encode_state(st))
    assert again.acqs[0].ctx is restored.acqs[0].ctx  # one shared tuple
    r.detector.states[CELERY] = restored
    assert r.finding(CELERY, 1) == before


def test_a_forgotten_acquisition_keeps_the_displaced_side_the_finding_showed() -> None:
    events = [*celery_history()[:3], celery_history()[3]]
    r = run(events, Config(max_acquisitions=2))
    shown = r.finding(CELERY, 1).context
    r.feed([acq("d3", 3, "w3", 10, CELERY), acq("d4", 4, "w4", 11, CELERY)])
    assert all(a.epoch != 1 for a in r.detector.states[CELERY].acqs)  # forgotten at the cap
    assert shown is not None
    assert r.finding(CELERY, 1).context.displaced == shown.displaced  # type: ignore[union-attr]


# ---- where people read it ---------------------------------------------------------------------


def celery_finding() -> Finding:
    return run(celery_history()).finding(CELERY, 1)


def test_the_text_report_shows_the_context() -> None:
    lines = finding_lines([celery_finding()])
    assert "  context of the displaced owner (epoch 1): task=myapp.add, delivery=1" in lines
    assert "  context of the latest condition: rows=3" in lines
    assert (
        "  context of the current owner (epoch 2): task=myapp.add, cause=visibility_timeout"
        in lines
    )


def test_the_owners_words_come_before_how_the_adapter_derived_the_epoch() -> None:
    trust = {"epoch_authority": "minted", "epoch_from": "celery.redelivered", **TASK}
    f = run(
        [
            acq("d1", 1, "w1", 1, CELERY, attrs=trust, detail={"attempt": 1}),
            acq("d2", 2, "w2", 2, CELERY, attrs=trust, detail={"attempt": 2}),
            commit("c1", 1, "w1", 3, key="sum/8f1b", wf=CELERY),
        ]
    ).finding(CELERY, 1)
    assert (
        "  context of the displaced owner (epoch 1): task=myapp.add, attempt=1, "
        "epoch_authority=minted, epoch_from=celery.redelivered"
    ) in finding_lines([f])


T0 = datetime(2026, 7, 26, 10, 0, tzinfo=UTC)


def test_the_page_shows_the_context_in_annotations_and_details_never_labels() -> None:
    f = celery_finding()
    d = Delivery(SinkName.ALERTMANAGER, Action.FIRE, f, 0, T0, T0, None)
    (alert,) = AlertmanagerSink("http://am:9093").alerts(d, T0)
    assert "myapp.add" not in json.dumps(alert["labels"])
    assert alert["annotations"]["context"] == (
        "displaced owner (epoch 1): task=myapp.add, delivery=1; latest condition: rows=3; "
        "current owner (epoch 2): task=myapp.add, cause=visibility_timeout"
    )
    from pydantic import SecretStr  # noqa: PLC0415

    d = Delivery(SinkName.PAGERDUTY, Action.TRIGGER, f, 0, T0, T0, None)
    details = PagerDutySink(SecretStr("k" * 32)).event(d)["payload"]["custom_details"]
    assert details["context"]["current"] == {"task": "myapp.add", "cause": "visibility_timeout"}
    assert details["context"]["displaced"]["delivery"] == "1"


def test_the_view_and_the_html_report_show_the_context_escaped() -> None:
    f = celery_finding()
    page = pages.finding([f])
    assert "<h2>Context</h2>" in page
    assert "task=myapp.add, cause=visibility_timeout" in page
    marked = f.model_copy(
        update={"context": f.context.model_copy(update={"current": {"x": "<b>"}})}  # type: ignore[union-attr]
    )
    report = render([marked], EventWindows(), source="-", events=0, workflows=1)
    assert "x=&lt;b&gt;" in report and "<h3>Context</h3>" in report
    no_context = f.model_copy(update={"context": None})
    assert "Context" not in pages.finding([no_context])
