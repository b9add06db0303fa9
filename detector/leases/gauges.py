"""Live lease gauges, read from the database by the relay (`splitbrain leases relay
--metrics-port`).

The detector's lease metrics are observed when the next event arrives, so a worker that goes
silent produces nothing there. These are read from the job table itself, on the database's
clock, every few seconds: per job class the running leases' heartbeat age and lease left (the
oldest and the distribution), the expired leases no worker has reclaimed yet, the queue, and the
outbox the relay has not published yet. Labels are the job class (the operator's list), the
labels the class declares its jobs differ by (`JobClass.labels`: tool_class, model, provider, as
recorded with each job at enqueue, so a relay needs no class definitions), and fixed words only.
A class that declares none has the job class alone, as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.rows import DictRow

# The quantiles of the running leases' heartbeat age (1: the oldest) and of their lease left
# (0: the least, negative once expired).
AGE_QUANTILES: Final = (0.5, 0.9, 1.0)
LEFT_QUANTILES: Final = (0.0, 0.1, 0.5)

_CLASSES: Final = """
SELECT job_class, gauge_labels,
       count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'running' AND lease_until <= now()) AS expired,
       percentile_cont(%(age)s::float8[]) WITHIN GROUP (ORDER BY age) AS age,
       percentile_cont(%(left)s::float8[]) WITHIN GROUP (ORDER BY lease_left) AS lease_left
  FROM (SELECT job_class, gauge_labels, state, lease_until,
               CASE WHEN state = 'running'
                    THEN extract(epoch FROM now() - heartbeat_at)::float8 END AS age,
               CASE WHEN state = 'running'
                    THEN extract(epoch FROM lease_until - now())::float8 END AS lease_left
          FROM tool_jobs WHERE state IN ('queued', 'running')) AS open
 GROUP BY job_class, gauge_labels
"""
_OUTBOX: Final = """
SELECT count(*) AS unrelayed,
       coalesce(extract(epoch FROM now() - min(created_at))::float8, 0) AS oldest_age
  FROM tool_job_outbox WHERE relayed_at IS NULL
"""


@dataclass(frozen=True, slots=True)
class OpenJobs:
    """The open jobs of one job class and one set of the labels it declares."""

    labels: Mapping[str, str]  # job_class, and the class's declared labels
    queued: int
    running: int
    expired: int
    heartbeat_age: Sequence[float] = ()  # at AGE_QUANTILES; none when none is running
    lease_left: Sequence[float] = ()  # at LEFT_QUANTILES


class _OpenJobsGauges(Collector):
    """The per-class gauges of the last snapshot. A collector rather than `Gauge`s: a series
    carries the labels its class declares and no others, so a class that declares none keeps
    the job class alone (an empty label would show where nothing was declared)."""

    def __init__(self) -> None:
        self.snapshot: tuple[OpenJobs, ...] = ()

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "splitbrain_lease_store_jobs",
            "Open jobs of the lease store by job class, its declared labels and state (queued, "
            "running)",
        )
        expired = GaugeMetricFamily(
            "splitbrain_lease_store_expired",
            "Running jobs whose lease ran out and that no worker has claimed again yet",
        )
        age = GaugeMetricFamily(
            "splitbrain_lease_store_heartbeat_age_seconds",
            "Time since the running leases' last claim or extension, on the database's clock, "
            "as quantiles (1: the oldest)",
        )
        left = GaugeMetricFamily(
            "splitbrain_lease_store_lease_remaining_seconds",
            "Lease left of the running jobs, on the database's clock, as quantiles (0: the "
            "least; negative once expired)",
        )
        for group in self.snapshot:
            labels = dict(group.labels)
            jobs.add_sample(jobs.name, {**labels, "state": "queued"}, group.queued)
            jobs.add_sample(jobs.name, {**labels, "state": "running"}, group.running)
            expired.add_sample(expired.name, labels, group.expired)
            for family, quantiles, values in (
                (age, AGE_QUANTILES, group.heartbeat_age),
                (left, LEFT_QUANTILES, group.lease_left),
            ):
                for q, value in zip(quantiles, values, strict=False):
                    family.add_sample(family.name, {**labels, "quantile": f"{q:g}"}, value)
        yield from (jobs, expired, age, left)


class LeaseGauges:
    """The relay's metrics: the gauges it reads from the database, and its own progress."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.open_jobs = _OpenJobsGauges()
        r.register(self.open_jobs)
        self.unrelayed = Gauge(
            "splitbrain_lease_store_outbox_unrelayed",
            "Outbox rows not yet published to Kafka",
            registry=r,
        )
        self.oldest_unrelayed = Gauge(
            "splitbrain_lease_store_outbox_oldest_unrelayed_age_seconds",
            "Age of the oldest outbox row not yet published: the relay's lag (0 when none)",
            registry=r,
        )
        self.relayed = Counter(
            "splitbrain_lease_store_relayed", "Outbox rows this relay published", registry=r
        )
        self.dead_lettered = Counter(
            "splitbrain_lease_store_dead_lettered",
            "Outbox rows this relay sent to the DLQ topic because they are no valid event",
            registry=r,
        )
        self.last_step = Gauge(
            "splitbrain_lease_store_relay_last_step_timestamp_seconds",
            "When this relay last completed a step (published a batch or found none), Unix time",
            registry=r,
        )

    def stepped(self, published: int, dead_lettered: int = 0) -> None:
        self.relayed.inc(published)
        self.dead_lettered.inc(dead_lettered)
        self.last_step.set(time.time())

    def refresh(self, conn: psycopg.Connection[DictRow]) -> None:
        """Read the gauges in one snapshot; a class with no open job loses its series."""
        with conn.transaction():
            classes = conn.execute(
                _CLASSES, {"age": list(AGE_QUANTILES), "left": list(LEFT_QUANTILES)}
            ).fetchall()
            outbox = conn.execute(_OUTBOX).fetchone()
        self.open_jobs.snapshot = tuple(
            OpenJobs(
                labels={"job_class": row["job_class"], **row["gauge_labels"]},
                queued=row["queued"],
                running=row["running"],
                expired=row["expired"],
                heartbeat_age=row["age"] if row["running"] else (),
                lease_left=row["lease_left"] if row["running"] else (),
            )
            for row in classes
        )
        assert outbox is not None
        self.unrelayed.set(outbox["unrelayed"])
        self.oldest_unrelayed.set(outbox["oldest_age"])
