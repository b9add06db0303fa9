"""Prometheus metrics of the findings view, in a registry of its own (`splitbrain_ui_…`).

Labels are bounded: `route` is a route's template (never a finding id), `code` an HTTP status,
`status` a finding's status.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from detector.contracts.findings import Status
from detector.view.store import FindingsStore


class _StoreCollector(Collector):
    """What the store holds, read when scraped."""

    def __init__(self, store: FindingsStore) -> None:
        self._store = store

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        findings = GaugeMetricFamily(
            "splitbrain_ui_findings",
            "Findings loaded from the findings topic (their latest revision), by status.",
            labels=["status"],
        )
        latest = self._store.latest()
        for status in Status:
            findings.add_metric([status.value], sum(f.status == status for f in latest))
        yield findings
        yield CounterMetricFamily(
            "splitbrain_ui_records",
            "Records read from the findings topic, invalid ones included.",
            value=self._store.records,
        )
        yield CounterMetricFamily(
            "splitbrain_ui_invalid_records",
            "Records of the findings topic that are not a valid finding (skipped, logged).",
            value=self._store.invalid,
        )
        yield GaugeMetricFamily(
            "splitbrain_ui_caught_up",
            "1 once every partition of the findings topic was read to its end (/healthz ready).",
            value=float(self._store.caught_up),
        )


class ViewMetrics:
    def __init__(self, store: FindingsStore) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StoreCollector(store))
        self.requests = Counter(
            "splitbrain_ui_requests",
            "HTTP requests answered, by route template and status code.",
            ["route", "code"],
            registry=self.registry,
        )
