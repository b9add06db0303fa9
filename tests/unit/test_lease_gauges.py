"""The lease store's live gauges as exported (issue 38): a class's series carry the labels it
declares and no others, so a class that declares none keeps the job class alone."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from detector.leases.gauges import LeaseGauges, OpenJobs


def test_each_series_carries_its_class_s_declared_labels_only() -> None:
    gauges = LeaseGauges(CollectorRegistry())
    gauges.open_jobs.snapshot = (
        OpenJobs({"job_class": "ocr"}, queued=1, running=0, expired=0),
        OpenJobs(
            {"job_class": "llm", "model": "model-b", "provider": "example-llm"},
            queued=0,
            running=2,
            expired=1,
            heartbeat_age=(1.0, 2.0, 3.0),
            lease_left=(-1.0, 0.5, 4.0),
        ),
    )
    lines = generate_latest(gauges.registry).decode().splitlines()
    assert 'splitbrain_lease_store_jobs{job_class="ocr",state="queued"} 1.0' in lines
    assert 'splitbrain_lease_store_expired{job_class="ocr"} 0.0' in lines
    assert (
        'splitbrain_lease_store_jobs{job_class="llm",model="model-b",provider="example-llm",'
        'state="running"} 2.0'
    ) in lines
    assert (
        'splitbrain_lease_store_heartbeat_age_seconds{job_class="llm",model="model-b",'
        'provider="example-llm",quantile="1"} 3.0'
    ) in lines
    assert (
        'splitbrain_lease_store_lease_remaining_seconds{job_class="llm",model="model-b",'
        'provider="example-llm",quantile="0"} -1.0'
    ) in lines
    assert not [line for line in lines if "quantile" in line and 'job_class="ocr"' in line]
