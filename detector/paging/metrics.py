"""Prometheus metrics of the pager bridge, in a registry of its own (`splitbrain_page_…`).

Labels are bounded: `sink` (alertmanager, pagerduty, webhook), `outcome` (accepted, retried,
dead_letter), `severity`, `partition` of the findings topic. Never a finding id or workflow key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from detector.contracts.findings import Severity
from detector.contracts.page_state import SinkName
from detector.paging.delivery import DeliveryOutcome

# From a finding's commit to a sink's acceptance: sub-second when all is well, minutes while a
# sink is down or the bridge catches up.
LATENCY_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class PageMetrics:
    def __init__(
        self, sinks: Iterable[SinkName], registry: CollectorRegistry | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.deliveries = Counter(
            "splitbrain_page_deliveries",
            "Requests to a sink by outcome: accepted, retried (refused for now or no answer: "
            "sent again after a backoff), dead_letter (refused for good, logged). Alertmanager's "
            "periodic re-sends are counted too.",
            ["sink", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "splitbrain_page_delivery_latency_seconds",
            "From the Kafka timestamp of a finding revision (its commit by the detector) to its "
            "acceptance by a sink.",
            ["sink"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.pending = Gauge(
            "splitbrain_page_deliveries_pending",
            "Deliveries waiting for a sink to accept them; while there are any, the bridge "
            "reads no further and commits no offsets.",
            ["sink"],
            registry=r,
        )
        self.open = Gauge(
            "splitbrain_page_findings_open",
            "Open findings known to the bridge (of its assigned partitions), by severity.",
            ["severity"],
            registry=r,
        )
        self.lag = Gauge(
            "splitbrain_page_consumer_lag_records",
            "Findings-topic records not yet delivered to every sink and committed: the "
            "partition's end minus the bridge's committed offset (commit markers included).",
            ["partition"],
            registry=r,
        )
        self.invalid = Counter(
            "splitbrain_page_invalid_records",
            "Findings-topic records that are not a valid splitbrain.finding/v1: logged with "
            "their coordinates and skipped.",
            registry=r,
        )
        for sink in sinks:
            self.pending.labels(sink.value).set(0)
            for outcome in DeliveryOutcome:
                self.deliveries.labels(sink.value, outcome.value)
        for severity in Severity:
            self.open.labels(severity.value).set(0)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """/metrics on `address` (loopback unless told), as the worker's."""
        start_http_server(port, addr=address, registry=self.registry)

    def answered(
        self, sink: SinkName, outcome: DeliveryOutcome, latency: float | None = None
    ) -> None:
        self.deliveries.labels(sink.value, outcome.value).inc()
        if latency is not None and outcome is DeliveryOutcome.ACCEPTED:
            self.latency.labels(sink.value).observe(max(0.0, latency))

    def waiting(self, counts: Mapping[SinkName, int], sinks: Iterable[SinkName]) -> None:
        for sink in sinks:
            self.pending.labels(sink.value).set(counts.get(sink, 0))

    def findings_open(self, counts: Mapping[Severity, int]) -> None:
        for severity in Severity:
            self.open.labels(severity.value).set(counts.get(severity, 0))

    def consumer_lag(self, partition: int, records: int | None) -> None:
        if records is None:
            with contextlib.suppress(KeyError):  # never reported
                self.lag.remove(str(partition))
        else:
            self.lag.labels(str(partition)).set(records)
