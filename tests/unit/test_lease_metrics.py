"""Lease-health metrics a worker derives from any emitter's ownership events (issue 10).

Events go through the processing step both runtimes share (`PartitionProcessor`); its tick
exports what the engine counted, into a fresh registry per test.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from detector.core import (
    Config,
    Detector,
    LabelBounds,
    WorkflowState,
    decode_state,
    encode_state,
)
from detector.runtime.processor import TICK_EVERY_S, PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.histories import BASE

TOPIC = "agent.ownership.v1"
OCR = {"tool_class": "ocr", "model": "tesseract-5", "provider": "local"}
OCR_LABELS = {"tool_class": "ocr", "model": "tesseract-5", "provider": "local"}
UNLABELLED = {"tool_class": "unlabelled", "model": "unlabelled", "provider": "unlabelled"}

AGE = "splitbrain_lease_heartbeat_age_seconds"
REMAINING = "splitbrain_lease_remaining_seconds"
EXPIRED = "splitbrain_leases_expired_total"
FAILURES = "splitbrain_lease_extension_failures_total"
RECLAIMED = "splitbrain_jobs_reclaimed_total"


def time(t: float) -> str:
    return (BASE + timedelta(seconds=t)).isoformat()


def event(
    event_id: str,
    kind: str,
    epoch: int,
    t: float | None = None,
    *,
    wf: str = "wf-1",
    until: float | None = None,
    attrs: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[bytes, bytes]:
    """One input record; `t` and `until` are seconds after BASE (`observed_at`, `lease_until`)."""
    doc: dict[str, Any] = {
        "event_id": event_id,
        "kind": kind,
        "workflow_key": wf,
        "owner_epoch": epoch,
        "worker_id": f"worker-{epoch}",
        **extra,
    }
    if t is not None:
        doc["observed_at"] = time(t)
    if until is not None:
        doc["lease_until"] = time(until)
    if attrs is not None:
        doc["attrs"] = attrs
    return wf.encode(), json.dumps(doc).encode()


def acquired(event_id: str, epoch: int, t: float | None = None, **kw: Any) -> tuple[bytes, bytes]:
    kw.setdefault("attrs", OCR)
    return event(event_id, "lease_acquired", epoch, t, source="coordinator", **kw)


class Worker:
    """Partitions of one worker: processors sharing one `WorkerMetrics`."""

    def __init__(self, metrics: WorkerMetrics | None = None) -> None:
        self.metrics = metrics or WorkerMetrics(CollectorRegistry())
        self.partitions: dict[int, PartitionProcessor] = {}
        self.now = 1000.0
        self.offset = 0

    def processor(self, partition: int = 0) -> PartitionProcessor:
        p = self.partitions.get(partition)
        if p is None:
            p = self.partitions[partition] = PartitionProcessor(
                partition, Detector(Config()), self.metrics
            )
        return p

    def feed(self, *records: tuple[bytes, bytes], partition: int = 0) -> Worker:
        p = self.processor(partition)
        for key, value in records:
            outcome = p.process(key, value, TOPIC, self.offset, now=self.now)
            assert outcome.dead_letter is None, outcome.dead_letter
            self.offset += 1
        return self

    def tick(self) -> Worker:
        self.now += TICK_EVERY_S
        for p in self.partitions.values():
            assert p.tick(self.now) is not None
        return self

    def value(self, name: str, **labels: str) -> float:
        sample = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if sample is None else sample

    def buckets(self, name: str, **labels: str) -> dict[str, float]:
        """le -> the cumulative count of a histogram's series."""
        return {
            s.labels["le"]: s.value
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name == f"{name}_bucket"
            and {k: v for k, v in s.labels.items() if k != "le"} == labels
        }

    def label_sets(self, name: str) -> set[tuple[tuple[str, str], ...]]:
        return {
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("le", "reason")))
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name.startswith(name)
        }


# ---- 1. heartbeat age ------------------------------------------------------------------------


def test_heartbeat_age_is_the_gap_since_the_acquisition_then_the_previous_heartbeat() -> None:
    w = Worker().feed(
        acquired("a1", 1, t=0),
        event("h1", "heartbeat", 1, t=10),
        event("h2", "heartbeat", 1, t=40),  # 30 s
        event("h3", "heartbeat", 1, t=43),  # 3 s
        event("p1", "progress", 1, t=50),  # not a heartbeat
    )
    assert w.value(f"{AGE}_count", **OCR_LABELS) == 0  # exported at the tick, not per event
    w.tick()
    assert w.value(f"{AGE}_count", **OCR_LABELS) == 3
    assert w.value(f"{AGE}_sum", **OCR_LABELS) == 43
    buckets = w.buckets(AGE, **OCR_LABELS)
    assert (buckets["2.0"], buckets["5.0"], buckets["10.0"], buckets["30.0"]) == (0, 1, 2, 3)
    assert buckets["+Inf"] == 3


def test_a_displaced_owners_heartbeats_and_heartbeats_without_a_time_are_no_age() -> None:
    w = Worker().feed(
        acquired("a1", 1, t=0),
        acquired("a2", 2, t=5),
        event("s1", "heartbeat", 1, t=500),  # the displaced owner, far later
        event("h0", "heartbeat", 2),  # no observed_at
        event("h1", "heartbeat", 2, t=25),  # 20 s after epoch 2's acquisition
    )
    w.tick()
    assert w.value(f"{AGE}_count", **OCR_LABELS) == 1
    assert w.value(f"{AGE}_sum", **OCR_LABELS) == 20


def test_counts_are_exported_once_however_many_ticks() -> None:
    w = Worker().feed(acquired("a1", 1, t=0), event("h1", "heartbeat", 1, t=10))
    w.tick().tick().tick()
    assert w.value(f"{AGE}_count", **OCR_LABELS) == 1
    w.feed(event("h2", "heartbeat", 1, t=20)).tick()
    assert w.value(f"{AGE}_count", **OCR_LABELS) == 2
    assert w.value(f"{AGE}_sum", **OCR_LABELS) == 20


# ---- 2. lease time remaining -----------------------------------------------------------------


def test_lease_remaining_is_the_previous_lease_until_minus_the_heartbeat_time() -> None:
    w = (
        Worker()
        .feed(
            acquired("a1", 1, t=0, until=30),
            event("h1", "heartbeat", 1, t=10, until=40),  # 20 s left of the acquisition's lease
            event("h2", "heartbeat", 1, t=38, until=68),  # 2 s left: close to expiry
            event("h3", "heartbeat", 1, t=70, until=100),  # 2 s after the lease ran out
        )
        .tick()
    )
    assert w.value(f"{REMAINING}_count", **OCR_LABELS) == 3
    assert w.value(f"{REMAINING}_sum", **OCR_LABELS) == 20 + 2 - 2
    buckets = w.buckets(REMAINING, **OCR_LABELS)
    assert (buckets["0.0"], buckets["1.0"], buckets["2.0"], buckets["20.0"]) == (1, 1, 2, 3)


def test_lease_remaining_is_skipped_when_either_time_is_missing() -> None:
    w = (
        Worker()
        .feed(
            acquired("a1", 1, t=0),  # no lease_until
            event("h1", "heartbeat", 1, t=10, until=40),  # nothing to compare with
            event("h2", "heartbeat", 1, until=50),  # no observed_at
            event("h3", "heartbeat", 1, t=30),  # compared with h2's lease_until: 20 s
            event("h4", "heartbeat", 1, t=40),  # h3 gave no lease_until
        )
        .tick()
    )
    assert w.value(f"{REMAINING}_count", **OCR_LABELS) == 1
    assert w.value(f"{REMAINING}_sum", **OCR_LABELS) == 20


def test_lease_remaining_compares_only_the_current_epochs_lease() -> None:
    w = (
        Worker()
        .feed(
            acquired("a1", 1, t=0, until=30),
            acquired("a2", 2, t=40, until=70),
            event("s1", "heartbeat", 1, t=45, until=75),  # displaced: neither compared nor kept
            event("h1", "heartbeat", 2, t=60, until=90),  # 10 s left of epoch 2's lease
        )
        .tick()
    )
    assert w.value(f"{REMAINING}_count", **OCR_LABELS) == 1
    assert w.value(f"{REMAINING}_sum", **OCR_LABELS) == 10


# ---- 3. expired leases, 5. reclaimed jobs ----------------------------------------------------


def test_a_takeover_of_a_lease_never_released_is_an_expiry_and_a_reclaim() -> None:
    w = Worker().feed(acquired("a1", 1, t=0), event("h1", "heartbeat", 1, t=10)).tick()
    assert (w.value(EXPIRED, **OCR_LABELS), w.value(RECLAIMED, **OCR_LABELS)) == (0, 0)
    w.feed(acquired("a2", 2, t=100)).tick()
    assert (w.value(EXPIRED, **OCR_LABELS), w.value(RECLAIMED, **OCR_LABELS)) == (1, 1)


def test_an_acquisition_after_a_release_is_a_reclaim_but_no_expiry() -> None:
    w = (
        Worker()
        .feed(
            acquired("a1", 1, t=0),
            event("r1", "lease_released", 1, t=20),
            acquired("a2", 2, t=30),
        )
        .tick()
    )
    assert (w.value(EXPIRED, **OCR_LABELS), w.value(RECLAIMED, **OCR_LABELS)) == (0, 1)


def test_first_repeated_and_late_acquisitions() -> None:
    w = (
        Worker()
        .feed(
            acquired("a3", 3, t=30),  # the first acquisition seen: neither
            acquired("a3b", 3, t=31),  # the same epoch again, another id: neither
            acquired("a3", 3, t=30),  # redelivered: nothing
            acquired("a2", 2, t=20),  # a late, lower epoch: a reclaim, expiry not known
        )
        .tick()
    )
    assert (w.value(EXPIRED, **OCR_LABELS), w.value(RECLAIMED, **OCR_LABELS)) == (0, 1)


# ---- 4. extension failures -------------------------------------------------------------------


def test_lost_and_uncertain_leases_are_extension_failures_by_reason() -> None:
    w = (
        Worker()
        .feed(
            acquired("a1", 1, t=0),
            event("u1", "ownership_uncertain", 1, t=10),
            event("l1", "lease_lost", 1, t=20),
            event("l2", "heartbeat_lost", 1, t=25),  # the job-queue alias
            event("l2", "heartbeat_lost", 1, t=25),  # redelivered
        )
        .tick()
    )
    assert w.value(FAILURES, reason="lost", **OCR_LABELS) == 2
    assert w.value(FAILURES, reason="uncertain", **OCR_LABELS) == 1


def test_an_emitter_that_never_acquires_is_labelled_by_its_events_attrs() -> None:
    w = (
        Worker()
        .feed(
            event("u1", "ownership_uncertain", 4, t=0, attrs={"tool_class": "browser"}),
            event("h1", "heartbeat", 4, t=10),
        )
        .tick()
    )
    browser = {"tool_class": "browser", "model": "unlabelled", "provider": "unlabelled"}
    assert w.value(FAILURES, reason="uncertain", **browser) == 1
    assert w.value(f"{AGE}_count", **browser) == 0  # no earlier heartbeat or acquisition time
    w.feed(event("h2", "heartbeat", 4, t=25)).tick()
    assert w.value(f"{AGE}_sum", **browser) == 15


def test_every_label_set_starts_at_zero() -> None:
    """increase() cannot see a series that first appears at 1."""
    w = Worker().feed(acquired("a1", 1, t=0)).tick()
    for name, labels in [
        (EXPIRED, {}),
        (RECLAIMED, {}),
        (FAILURES, {"reason": "lost"}),
        (FAILURES, {"reason": "uncertain"}),
        (f"{AGE}_count", {}),
        (f"{REMAINING}_count", {}),
    ]:
        assert w.metrics.registry.get_sample_value(name, {**OCR_LABELS, **labels}) == 0, name


# ---- labels ----------------------------------------------------------------------------------


def test_missing_labels_are_unlabelled_and_bad_values_other() -> None:
    w = (
        Worker()
        .feed(
            acquired("a1", 1, t=0, wf="wf-1", attrs={}),
            acquired("b1", 1, t=0, wf="wf-2", attrs={"tool_class": "has space", "model": "x" * 65}),
            acquired("b2", 2, t=1, wf="wf-2", attrs={"tool_class": "ocr", "provider": "-lead"}),
        )
        .tick()
    )
    assert w.value(f"{AGE}_count", **UNLABELLED) == 0
    assert w.value(EXPIRED, tool_class="ocr", model="unlabelled", provider="other") == 1
    sets = w.label_sets(EXPIRED)
    assert (("model", "other"), ("provider", "unlabelled"), ("tool_class", "other")) in sets
    assert not any("wf-" in v or "worker-" in v for s in sets for _, v in s)


def test_label_values_beyond_the_engines_cap_become_other() -> None:
    w = Worker()
    w.processor().detector.lease_health.bounds = LabelBounds(max_values=2)
    w.feed(
        *(
            acquired(f"a{i}", 1, t=0, wf=f"wf-{i}", attrs={"tool_class": f"tool-{i}"})
            for i in range(5)
        ),
        *(event(f"l{i}", "lease_lost", 1, t=5, wf=f"wf-{i}") for i in range(5)),
    ).tick()
    lost = {
        s[2][1]: w.value(
            FAILURES, reason="lost", tool_class=s[2][1], model=s[0][1], provider=s[1][1]
        )
        for s in w.label_sets(FAILURES)
    }
    assert lost == {"tool-0": 1, "tool-1": 1, "other": 3}
    # a workflow keeps one shared tuple of its labels, whatever its tool class
    states = w.processor().detector.states
    assert states["wf-3"].labels is states["wf-4"].labels
    assert states["wf-3"].labels == ("other", "unlabelled", "unlabelled")


def test_the_cap_holds_across_a_workers_partitions() -> None:
    """Each partition's engine caps its own values; the worker caps what it exports again."""
    w = Worker(WorkerMetrics(CollectorRegistry(), max_label_values=1))
    for partition, tool in enumerate(["ocr", "browser", "export"]):
        w.feed(
            acquired(f"a{partition}", 1, t=0, attrs={"tool_class": tool, "model": "m"}),
            event(f"l{partition}", "lease_lost", 1, t=1),
            partition=partition,
        )
    w.tick()
    assert {dict(s)["tool_class"] for s in w.label_sets(FAILURES)} == {"ocr", "other"}
    assert (
        w.value(FAILURES, reason="lost", tool_class="other", model="m", provider="unlabelled") == 2
    )


def test_a_fresh_engine_for_a_partition_counts_from_zero() -> None:
    w = Worker().feed(acquired("a1", 1, t=0), event("l1", "lease_lost", 1, t=5)).tick()
    assert w.value(FAILURES, reason="lost", **OCR_LABELS) == 1
    # a restore: the partition's new engine counts from zero, the exported counter goes on
    w.metrics.engine_replaced(0)
    w.partitions[0] = PartitionProcessor(0, Detector(Config()), w.metrics)
    w.feed(acquired("b1", 1, t=0, wf="wf-2"), event("m1", "lease_lost", 1, t=5, wf="wf-2"))
    w.tick()
    assert w.value(FAILURES, reason="lost", **OCR_LABELS) == 2


# ---- per-workflow state ----------------------------------------------------------------------


def test_labels_and_the_lease_survive_the_changelog() -> None:
    w = Worker().feed(acquired("a1", 1, t=0, until=30), event("h1", "heartbeat", 1, t=10, until=40))
    detector = w.processor().detector
    state = detector.states["wf-1"]
    assert state.labels == ("ocr", "tesseract-5", "local")
    restored = decode_state(encode_state(state))
    assert restored == state
    # a restored workflow goes on: its next heartbeat is measured against h1's lease_until
    fresh = Detector(Config(), states={"wf-1": restored})
    w.partitions[0] = PartitionProcessor(0, fresh, w.metrics)
    w.metrics.engine_replaced(0)
    w.feed(event("h2", "heartbeat", 1, t=35, until=65)).tick()
    assert w.value(f"{REMAINING}_sum", **OCR_LABELS) == 5
    assert (
        fresh.states["wf-1"].labels
        is fresh.lease_health.stats_of(("ocr", "tesseract-5", "local")).labels
    )


def test_a_release_is_remembered_in_the_changelog_for_the_next_takeover() -> None:
    w = Worker().feed(acquired("a1", 1, t=0), event("r1", "lease_released", 1, t=20))
    restored = decode_state(encode_state(w.processor().detector.states["wf-1"]))
    w.partitions[0] = PartitionProcessor(
        0, Detector(Config(), states={"wf-1": restored}), w.metrics
    )
    w.feed(acquired("a2", 2, t=30)).tick()
    assert (w.value(EXPIRED, **OCR_LABELS), w.value(RECLAIMED, **OCR_LABELS)) == (0, 1)


@pytest.mark.parametrize("released", [False, True])
def test_a_version_3_state_from_before_the_labels_still_decodes(released: bool) -> None:
    """Written with the tool class alone and no lease_until (18 fields)."""
    state = WorkflowState(hb_obs=5.0, lease_s=90.0, released_at=7.0 if released else None)
    fields = msgspec.msgpack.decode(encode_state(state))
    assert len(fields) == 21
    old = [3, *fields[1:16], "ocr", fields[17]]
    decoded = decode_state(msgspec.msgpack.encode(old))
    assert decoded.labels == ("ocr", "unlabelled", "unlabelled")
    assert (decoded.hb_obs, decoded.lease_s) == (5.0, 90.0)
    assert (decoded.lease_until is not None) == released  # a release since the acquisition
    assert WorkflowState(tool_class="ocr").labels == decoded.labels  # versions 1 and 2
