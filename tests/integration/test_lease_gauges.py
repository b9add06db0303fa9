"""The relay's live lease gauges, read from a real PostgreSQL (issue 23): a worker that went
silent shows as an old heartbeat, a lease running out and then an expired lease, with no event
needed; the outbox's backlog and its age are the relay's lag."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg.rows import DictRow

from detector.leases import Labels, LeaseInputError, LeaseStore
from detector.leases.gauges import LeaseGauges
from detector.leases.policy import LabelValues
from tests.integration.leases import claimed, job_class, wait_lapsed


def sample(gauges: LeaseGauges, name: str, **labels: str) -> float | None:
    return gauges.registry.get_sample_value(name, labels)


def test_gauges_show_a_silent_worker_s_lease_running_out_and_the_outbox_backlog(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    gauges = LeaseGauges(CollectorRegistry())
    with LeaseStore(postgres_dsn, [job_class("ocr"), job_class("web")]) as store:
        for n in range(3):
            store.enqueue("ocr", f"doc:{n}:ocr", {})
        store.enqueue("web", "q:1:search", {})
        silent = claimed(store.claim("ocr", "w1"))  # and never extends again
        gauges.refresh(db)
        assert sample(gauges, "splitbrain_lease_store_jobs", job_class="ocr", state="queued") == 2
        assert sample(gauges, "splitbrain_lease_store_jobs", job_class="ocr", state="running") == 1
        assert sample(gauges, "splitbrain_lease_store_jobs", job_class="web", state="queued") == 1
        assert sample(gauges, "splitbrain_lease_store_expired", job_class="ocr") == 0
        left = sample(
            gauges, "splitbrain_lease_store_lease_remaining_seconds", job_class="ocr", quantile="0"
        )
        assert left is not None and 0 < left <= 1.0
        # No running job of the class: no heartbeat series for it.
        assert (
            sample(
                gauges,
                "splitbrain_lease_store_heartbeat_age_seconds",
                job_class="web",
                quantile="1",
            )
            is None
        )

        wait_lapsed(db, silent)
        gauges.refresh(db)
        assert sample(gauges, "splitbrain_lease_store_expired", job_class="ocr") == 1
        oldest = sample(
            gauges, "splitbrain_lease_store_heartbeat_age_seconds", job_class="ocr", quantile="1"
        )
        assert oldest is not None and oldest >= 1.0  # the lease is one second long
        left = sample(
            gauges, "splitbrain_lease_store_lease_remaining_seconds", job_class="ocr", quantile="0"
        )
        assert left is not None and left <= 0
        assert sample(gauges, "splitbrain_lease_store_outbox_unrelayed") == 1  # the claim
        age = sample(gauges, "splitbrain_lease_store_outbox_oldest_unrelayed_age_seconds")
        assert age is not None and age >= 1.0

        # The job reclaimed and finished, the outbox relayed: the series follow.
        store.complete(claimed(store.claim("ocr", "w2")), {})
        db.execute("UPDATE tool_job_outbox SET relayed_at = now()")
        gauges.refresh(db)
        assert sample(gauges, "splitbrain_lease_store_expired", job_class="ocr") == 0
        assert sample(gauges, "splitbrain_lease_store_jobs", job_class="ocr", state="running") == 0
        assert sample(gauges, "splitbrain_lease_store_outbox_unrelayed") == 0
        assert sample(gauges, "splitbrain_lease_store_outbox_oldest_unrelayed_age_seconds") == 0


def test_gauges_split_a_class_by_the_labels_it_declares(
    postgres_dsn: str, db: psycopg.Connection[DictRow]
) -> None:
    """Issue 38: lease health by model and provider where a class's jobs differ by them, and by
    job class alone where they do not."""
    llm = job_class("llm").model_copy(
        update={"labels": LabelValues(model={"model-a", "model-b"}, provider={"acme-llm"})}
    )
    gauges = LeaseGauges(CollectorRegistry())
    with LeaseStore(postgres_dsn, [llm, job_class("ocr")]) as store:
        store.enqueue(
            "llm", "q:1", {}, Labels(tool_class="chat", model="model-b", provider="acme-llm")
        )
        store.enqueue("llm", "q:2", {}, Labels(model="model-a", provider="acme-llm"))
        store.enqueue("llm", "q:3", {}, Labels(model="model-a", provider="acme-llm"))
        store.enqueue("ocr", "doc:1", {}, Labels(tool_class="ocr", model="tesseract"))
        with pytest.raises(
            LeaseInputError, match="model: job class 'llm' declares model-a, model-b"
        ):
            store.enqueue("llm", "q:4", {}, Labels(model="model-c", provider="acme-llm"))
        claimed(store.claim("llm", "w1"))  # q:1, the oldest
        gauges.refresh(db)
    model_b = {"job_class": "llm", "model": "model-b", "provider": "acme-llm"}
    model_a = {**model_b, "model": "model-a"}
    assert sample(gauges, "splitbrain_lease_store_jobs", **model_b, state="running") == 1
    assert sample(gauges, "splitbrain_lease_store_jobs", **model_a, state="queued") == 2
    assert sample(gauges, "splitbrain_lease_store_expired", **model_b) == 0
    assert sample(gauges, "splitbrain_lease_store_heartbeat_age_seconds", **model_b, quantile="1")
    assert sample(gauges, "splitbrain_lease_store_jobs", job_class="ocr", state="queued") == 1
