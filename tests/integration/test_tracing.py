"""`splitbrain worker`, both runtimes, exporting its traces over OTLP/HTTP to a local receiver:
events published by an agent inside its own spans (`Emitter`: a `traceparent` header), a finding
span per revision that links back to those spans, sampled processing spans, and the finding
counters' exemplars on /metrics in the OpenMetrics format.

Only `OTEL_*` variables configure it, as in production: the worker inherits them from this
process (`connection_env`), set for the test alone by `monkeypatch`.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from detector.contracts.events import Source
from detector.devstack.worker import WorkerProcess
from detector.kafka.emit import Emitter
from detector.testing.otlp import OtlpReceiver, ReceivedSpan
from tests.integration.deployment import Deployment, wait_for
from tests.integration.kafka_harness import OwnerFields

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
FINDING = "splitbrain.finding"
WORKFLOW = "tenant-7/export"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A receiver, and the variables that make the workers of the test export to it."""
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    with OtlpReceiver() as r:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")  # every batch: see its spans too
        yield r


def emit_split_brain(deployment: Deployment) -> dict[str, SpanContext]:
    """Alpha holds epoch 17; beta takes over (18); alpha checkpoints and commits an effect a
    destination confirms; beta commits it too. Each event from a span of the agent's own."""
    tracer = TracerProvider().get_tracer("agent")
    alpha: OwnerFields = {"workflow_key": WORKFLOW, "owner_epoch": 17, "worker_id": "alpha"}
    beta: OwnerFields = {"workflow_key": WORKFLOW, "owner_epoch": 18, "worker_id": "beta"}
    contexts: dict[str, SpanContext] = {}
    with Emitter(deployment.config, topic=deployment.topics.input) as emit:
        steps: list[tuple[str, Any]] = [
            ("a1", lambda: emit.lease_acquired(**alpha, seq=1, event_id="a1")),
            ("a2", lambda: emit.lease_acquired(**beta, seq=2, event_id="a2")),
            ("p3", lambda: emit.progress(**alpha, seq=3, event_id="p3")),
            (
                "c4",
                lambda: emit.effect_committed(
                    **alpha, seq=4, event_id="c4", effect_key="idx", source=Source.DESTINATION
                ),
            ),
            (
                "c5",
                lambda: emit.effect_committed(
                    **beta, seq=5, event_id="c5", effect_key="idx", source=Source.DESTINATION
                ),
            ),
        ]
        for event_id, step in steps:
            with tracer.start_as_current_span(f"agent step {event_id}") as span:
                step()
            contexts[event_id] = span.get_span_context()
    return contexts


def hex_ids(context: SpanContext) -> tuple[str, str]:
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def openmetrics(worker: WorkerProcess) -> str:
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            text: str = resp.read().decode()
            return text
    except OSError:
        return ""


def exemplars(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], str]:
    """(sample name, its labels) -> the trace id of its exemplar."""
    found = {}
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            if sample.exemplar is not None:
                labels = tuple(sorted(sample.labels.items()))
                found[(sample.name, labels)] = sample.exemplar.labels["trace_id"]
    return found


def test_finding_spans_link_back_to_the_agents_spans_and_exemplars_name_them(
    deployment: Deployment, receiver: OtlpReceiver
) -> None:
    w = deployment.worker()
    contexts = emit_split_brain(deployment)

    def revisions() -> dict[int, ReceivedSpan]:
        return {s.attributes["splitbrain.finding.revision"]: s for s in receiver.spans(FINDING)}

    wait_for(lambda: 3 in revisions(), "the span of the third revision", workers=[w])
    spans = revisions()
    assert sorted(spans) == [1, 2, 3]  # one span per revision, each once
    last = spans[3]
    attributes = last.attributes
    assert attributes["splitbrain.finding.severity"] == "critical"
    assert attributes["splitbrain.workflow.key"] == WORKFLOW
    assert (attributes["splitbrain.displaced.epoch"], attributes["splitbrain.current.epoch"]) == (
        17,
        18,
    )
    assert attributes["splitbrain.finding.id"].startswith("sb-")
    assert last.resource["service.name"] == "splitbrain-detector"
    assert last.resource["service.instance.id"] == w.instance
    linked = {(link.trace_id, link.span_id): link.attributes for link in last.links}
    assert linked == {
        hex_ids(contexts["a2"]): {
            "splitbrain.witness": ("transition",),
            "splitbrain.event.id": "a2",
        },
        hex_ids(contexts["p3"]): {
            "splitbrain.witness": ("stale_activity",),
            "splitbrain.event.id": "p3",
        },
        hex_ids(contexts["c4"]): {
            "splitbrain.witness": ("stale_effect_committed", "last_stale_event"),
            "splitbrain.event.id": "c4",
        },
        hex_ids(contexts["c5"]): {
            "splitbrain.witness": ("duplicate_effect",),
            "splitbrain.event.id": "c5",
        },
    }

    # Every batch is sampled here: each finding span is the child of its batch's span.
    batches = {s.span_id: s for s in receiver.spans(f"process {deployment.topics.input}")}
    assert last.parent_span_id in batches
    batch = batches[last.parent_span_id]
    assert batch.kind == 5  # SPAN_KIND_CONSUMER
    assert batch.attributes["messaging.system"] == "kafka"
    assert batch.attributes["messaging.operation.type"] == "process"
    assert batch.attributes["messaging.destination.name"] == deployment.topics.input
    assert batch.attributes["messaging.consumer.group.name"] == deployment.topics.group
    assert batch.attributes["messaging.batch.message_count"] >= 1
    assert hex_ids(contexts["c5"]) in {(link.trace_id, link.span_id) for link in batch.links}

    # The finding itself names the agent's spans of its conditions (from the headers).
    published: dict[int, dict[str, Any]] = {}
    with deployment.reader(deployment.topics.findings) as reader:

        def committed() -> bool:  # spans are exported at once, findings when the batch commits
            reader.poll(0.2)
            for record in reader.records:
                finding = json.loads(record.value)
                published[finding["revision"]] = finding
            return 3 in published

        wait_for(committed, "the third revision on the findings topic", workers=[w])
    final = published[3]
    assert final["trace_links"] == ["-".join(hex_ids(contexts[e])) for e in ("p3", "c4", "c5")]

    # The exemplars of the finding counters name the traces of their latest revisions.
    trace = {rev: span.trace_id for rev, span in spans.items()}
    expected = {
        ("splitbrain_finding_revisions_total", (("severity", "critical"), ("status", "open"))): (
            trace[3]
        ),
        ("splitbrain_finding_revisions_total", (("severity", "info"), ("status", "open"))): (
            trace[1]
        ),
        ("splitbrain_findings_opened_total", (("severity", "info"),)): trace[1],
        ("splitbrain_findings_escalated_total", (("severity", "critical"),)): trace[2],
    }

    def exemplified() -> bool:
        found = exemplars(openmetrics(w))
        return all(found.get(k) == v for k, v in expected.items())

    wait_for(exemplified, "the exemplars on /metrics", workers=[w])
    assert w.stop() == 0, w.tail()
