"""Traces of the processing step, with no broker: one span per finding revision linked to the
spans that emitted its evidence, processing spans per batch, exemplars on the finding counters,
and the `OTEL_*` variables that turn it on (off by default)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from detector.contracts.dead_letters import DeadLetter
from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding
from detector.core import Config, Detector
from detector.runtime.intake import admit
from detector.runtime.processor import PartitionProcessor, Writes
from detector.settings import SettingsError
from detector.telemetry.metrics import WorkerMetrics
from detector.telemetry.trace_context import traceparent
from detector.telemetry.tracing import (
    FINDING_SPAN,
    FindingsSampled,
    PartitionTracing,
    WorkerTracing,
    sampler_from_env,
)

TOPIC = "agent.ownership.v1"
GROUP = "splitbrain-detector"
Record = tuple[bytes, bytes, list[tuple[str, bytes]] | None]


def context(n: int) -> tuple[str, str]:
    """The (trace id, span id) of the emitting span of event number `n`: one trace each."""
    return f"{n:032x}", f"{n:016x}"


def header(n: int) -> list[tuple[str, bytes]]:
    trace_id, span_id = context(n)
    return [("traceparent", f"00-{trace_id}-{span_id}-01".encode())]


def record(
    n: int,
    event_id: str,
    kind: str,
    epoch: int,
    seq: int,
    *,
    traced: bool = True,
    workflow: str = "wf",
    **more: Any,
) -> Record:
    doc = {
        "event_id": event_id,
        "kind": kind,
        "workflow_key": workflow,
        "owner_epoch": epoch,
        "worker_id": f"worker-{epoch}",
        "seq": seq,
        **more,
    }
    return workflow.encode(), json.dumps(doc).encode(), header(n) if traced else None


# alpha holds epoch 1; beta takes over (epoch 2, the transition); alpha goes on: a checkpoint,
# then a commit that a destination confirms; beta commits the same effect: a failover duplicate.
HISTORY: list[Record] = [
    record(1, "a1", "lease_acquired", 1, 1, source="coordinator"),
    record(2, "a2", "lease_acquired", 2, 2, source="coordinator"),
    record(3, "p3", "progress", 1, 3),
    record(4, "c4", "effect_committed", 1, 4, effect_key="k", source="destination"),
    record(5, "c5", "effect_committed", 2, 5, effect_key="k", source="destination"),
]


class Traced:
    """A worker's tracing with the SDK's in-memory exporter, and one partition's processor."""

    def __init__(self, base: Sampler = ALWAYS_ON, capacity: int = 4096) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=FindingsSampled(base), shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracing = WorkerTracing(provider, topic=TOPIC, group=GROUP)
        self.processor = PartitionProcessor(
            3,
            Detector(Config()),
            WorkerMetrics(CollectorRegistry()),
            tracing=PartitionTracing(self.tracing, 3, capacity),
        )

    def run(self, records: Sequence[Record], *, batch: bool = False) -> list[Writes]:
        spans = self.tracing.batch() if batch else None
        outcomes = []
        for offset, (key, value, headers) in enumerate(records):
            if spans is not None:
                spans.add(3, headers)
            outcomes.append(self.processor.process(key, value, TOPIC, offset, 1.0, headers))
        if spans is not None:
            spans.end()
        return outcomes

    def spans(self, name: str = FINDING_SPAN) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


def revisions(outcomes: list[Writes]) -> list[Finding]:
    return [u.finding for o in outcomes for u in o.findings]


def links(span: ReadableSpan) -> dict[tuple[str, str], dict[str, Any]]:
    """(trace id, span id) in hex -> the link's attributes."""
    return {
        (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}"): dict(
            link.attributes or {}
        )
        for link in span.links
    }


def test_each_finding_revision_is_a_span_linked_to_the_spans_of_its_evidence() -> None:
    t = Traced()
    published = revisions(t.run(HISTORY))
    spans = t.spans()
    assert [s.attributes["splitbrain.finding.revision"] for s in spans if s.attributes] == [
        f.revision for f in published
    ]
    last, span = published[-1], spans[-1]
    assert span.kind is SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "splitbrain.finding.id": last.finding_id,
        "splitbrain.finding.revision": last.revision,
        "splitbrain.finding.severity": "critical",
        "splitbrain.finding.status": "open",
        "splitbrain.finding.confidence": last.confidence,
        "splitbrain.finding.escalated": False,
        "splitbrain.finding.conditions": (
            "stale_activity",
            "stale_effect_committed",
            "duplicate_effect",
        ),
        "splitbrain.workflow.key": "wf",
        "splitbrain.displaced.epoch": 1,
        "splitbrain.displaced.worker_id": "worker-1",
        "splitbrain.current.epoch": 2,
        "splitbrain.current.worker_id": "worker-2",
    }
    assert links(span) == {
        context(2): {"splitbrain.witness": ("transition",), "splitbrain.event.id": "a2"},
        context(3): {"splitbrain.witness": ("stale_activity",), "splitbrain.event.id": "p3"},
        context(4): {
            "splitbrain.witness": ("stale_effect_committed", "last_stale_event"),
            "splitbrain.event.id": "c4",
        },
        context(5): {"splitbrain.witness": ("duplicate_effect",), "splitbrain.event.id": "c5"},
    }
    # Not in any batch: each finding span begins a trace of its own.
    assert all(s.parent is None for s in spans)
    assert len({s.context.trace_id for s in spans}) == len(spans)


def test_a_traceparent_header_wins_over_the_event_fields_which_serve_without_one() -> None:
    t = Traced()
    own: dict[str, Any] = {"trace_id": "ab" * 16, "span_id": "cd" * 8}
    history = [
        *HISTORY[:2],
        record(3, "p3", "progress", 1, 3, traced=False, **own),  # the fields only
        record(4, "e4", "effect_attempted", 1, 4, effect_key="k", **own),  # both: the header
    ]
    t.run(history)
    assert set(links(t.spans()[-1])) == {context(2), ("ab" * 16, "cd" * 8), context(4)}


def test_the_header_context_reaches_the_finding_even_with_tracing_off() -> None:
    p = PartitionProcessor(3, Detector(Config()), WorkerMetrics(CollectorRegistry()))
    outcomes = [p.process(k, v, TOPIC, i, 1.0, h) for i, (k, v, h) in enumerate(HISTORY)]
    last = revisions(outcomes)[-1]
    assert last.trace_links == [f"{t}-{s}" for t, s in map(context, (3, 4, 5))]


def test_after_a_restore_the_links_come_from_the_engine_trace_links() -> None:
    t = Traced()
    remembered = t.processor.tracing
    t.processor.tracing = None  # processed before this partition was traced (a restore)
    t.run(HISTORY[:4])
    t.processor.tracing = remembered
    t.run([record(6, "c6", "effect_committed", 2, 6, effect_key="k", source="destination")])
    (span,) = t.spans()
    assert links(span) == {
        context(6): {"splitbrain.witness": ("duplicate_effect",), "splitbrain.event.id": "c6"},
        context(3): {"splitbrain.witness": ("condition",)},
        context(4): {"splitbrain.witness": ("condition",)},
    }


def test_remembered_contexts_are_bounded_and_the_oldest_go_first() -> None:
    # Other workflows of the partition: their progress, and their acquisitions.
    noise = [record(10 + i, f"h{i}", "progress", 1, i, workflow=f"o{i}") for i in range(3)]
    acquisitions = [
        record(20 + i, f"x{i}", "lease_acquired", 1, i, workflow=f"o{i}") for i in range(2)
    ]
    stale = record(3, "p3", "progress", 1, 3)
    t = Traced(capacity=2)
    t.run([*HISTORY[:2], *noise, acquisitions[0], stale])
    # The map of other events forgot p3's predecessors, not a2: one acquisition came since.
    assert context(2) in links(t.spans()[-1])
    t = Traced(capacity=2)
    t.run([*HISTORY[:2], *acquisitions, stale])
    assert context(2) not in links(t.spans()[-1])  # two acquisitions since: forgotten
    assert context(3) in links(t.spans()[-1])  # the stale event itself, just remembered


def test_processing_spans_follow_the_messaging_conventions_and_parent_the_findings() -> None:
    t = Traced()
    t.run(HISTORY, batch=True)
    (batch,) = t.spans(f"process {TOPIC}")
    assert batch.kind is SpanKind.CONSUMER and batch.parent is None
    assert dict(batch.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": TOPIC,
        "messaging.consumer.group.name": GROUP,
        "messaging.destination.partition.id": "3",
        "messaging.batch.message_count": len(HISTORY),
    }
    assert set(links(batch)) == {context(n) for n in range(1, 6)}  # the records' own spans
    findings = t.spans()
    assert findings and all(s.parent is not None for s in findings)
    assert {s.parent.span_id for s in findings if s.parent} == {batch.context.span_id}


def test_an_unsampled_batch_leaves_its_findings_sampled_in_traces_of_their_own() -> None:
    t = Traced(base=ALWAYS_OFF)
    published = revisions(t.run(HISTORY, batch=True))
    assert t.spans(f"process {TOPIC}") == []
    spans = t.spans()
    assert len(spans) == len(published)
    assert all(s.parent is None and s.context.trace_flags.sampled for s in spans)


def exemplars(metrics: WorkerMetrics) -> dict[tuple[str, str], str]:
    """(sample name, severity) -> the trace id of its exemplar, from the OpenMetrics text."""
    text = generate_latest(metrics.registry).decode()  # type: ignore[no-untyped-call]
    found = {}
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            if sample.exemplar is not None:
                found[(sample.name, sample.labels["severity"])] = sample.exemplar.labels["trace_id"]
    return found


def test_the_finding_counters_carry_the_trace_id_of_the_span_as_an_exemplar() -> None:
    t = Traced()
    t.run(HISTORY[:4])
    metrics = t.processor.metrics
    metrics.aborted()  # what an aborted transaction counted is not counted, nor exemplified
    assert exemplars(metrics) == {}
    t = Traced()
    t.run(HISTORY)
    metrics = t.processor.metrics
    assert exemplars(metrics) == {}  # counted when the transaction commits
    metrics.committed(0.01, len(HISTORY))
    spans = {s.attributes["splitbrain.finding.revision"]: s for s in t.spans() if s.attributes}
    trace = {rev: f"{s.context.trace_id:032x}" for rev, s in spans.items()}
    # Opened at info (rev 1), escalated to critical by the commit (rev 2), then the duplicate.
    assert exemplars(metrics) == {
        ("splitbrain_finding_revisions_total", "info"): trace[1],
        ("splitbrain_finding_revisions_total", "critical"): trace[3],
        ("splitbrain_findings_opened_total", "info"): trace[1],
        ("splitbrain_findings_escalated_total", "info"): trace[1],
        ("splitbrain_findings_escalated_total", "critical"): trace[2],
    }


def test_without_tracing_there_is_no_exemplar() -> None:
    p = PartitionProcessor(3, Detector(Config()), WorkerMetrics(CollectorRegistry()))
    for i, (k, v, h) in enumerate(HISTORY):
        p.process(k, v, TOPIC, i, 1.0, h)
    p.metrics.committed(0.01, len(HISTORY))
    assert exemplars(p.metrics) == {}
    assert "# {" not in generate_latest(p.metrics.registry).decode()  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
        (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", True),  # not sampled
        (b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later", True),
        (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later", False),
        (b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", False),
        (b"00-00000000000000000000000000000000-b7ad6b7169203331-01", False),
        (b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", False),
        (b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", False),
        (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01", False),
        (b"", False),
    ],
)
def test_traceparent_follows_w3c_trace_context(value: bytes, expected: bool) -> None:
    ids = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert traceparent([("other", b"x"), ("traceparent", value)]) == (ids if expected else None)
    assert traceparent({"traceparent": value}) == (ids if expected else None)


def test_an_invalid_header_leaves_the_event_fields_and_a_dead_letter_stays_one() -> None:
    key, value, _ = record(3, "p3", "progress", 1, 3, traced=False, trace_id="ab" * 16)
    event = admit(key, value, TOPIC, 0, 0, [("traceparent", b"garbage")])
    assert isinstance(event, OwnershipEvent)
    assert (event.trace_id, event.span_id) == ("ab" * 16, None)
    assert isinstance(admit(b"other", value, TOPIC, 0, 0, header(1)), DeadLetter)


# -- configuration: the OTEL_* variables --------------------------------------------------------

_OTEL = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in _OTEL:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def configured() -> WorkerTracing:
    return WorkerTracing.from_env(topic=TOPIC, group=GROUP, instance="w1")


def exporters(tracing: WorkerTracing) -> list[str]:
    assert tracing.provider is not None
    processors = tracing.provider._active_span_processor._span_processors
    return [type(p._batch_processor._exporter).__name__ for p in processors]  # type: ignore[attr-defined]


def test_tracing_is_off_unless_an_exporter_is_asked_for(env: pytest.MonkeyPatch) -> None:
    tracing = configured()
    assert not tracing.enabled and tracing.partition(0) is None
    spans = tracing.batch()
    spans.add(0, header(1))  # free, and harmless
    spans.end()
    env.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not configured().enabled
    env.setenv("OTEL_TRACES_EXPORTER", "console")
    env.setenv("OTEL_SDK_DISABLED", "TRUE")
    assert not configured().enabled


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"OTEL_TRACES_EXPORTER": "otlp"}, [OTLPSpanExporter]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, [OTLPSpanExporter]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}, [OTLPSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, [ConsoleSpanExporter, OTLPSpanExporter]),
    ],
)
def test_an_exporter_or_an_otlp_endpoint_turns_it_on(
    env: pytest.MonkeyPatch, variables: dict[str, str], expected: list[type]
) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    tracing = configured()
    try:
        assert tracing.enabled
        assert exporters(tracing) == [e.__name__ for e in expected]
        assert tracing.provider is not None
        resource = tracing.provider.resource.attributes
        assert (resource["service.name"], resource["service.instance.id"]) == (
            "splitbrain-detector",
            "w1",
        )
    finally:
        tracing.shutdown()


def test_the_service_name_and_resource_come_from_the_otel_variables_when_given(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("OTEL_TRACES_EXPORTER", "console")
    env.setenv("OTEL_SERVICE_NAME", "detector-eu")
    env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7,deployment.environment=prod")
    tracing = configured()
    try:
        assert tracing.provider is not None
        resource = tracing.provider.resource.attributes
        assert resource["service.name"] == "detector-eu"
        assert resource["service.instance.id"] == "pod-7"
        assert resource["deployment.environment"] == "prod"
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(
    ("variables", "description"),
    [
        ({}, "ParentBased{root:TraceIdRatioBased{0.01}"),
        ({"OTEL_TRACES_SAMPLER_ARG": "0.25"}, "ParentBased{root:TraceIdRatioBased{0.25}"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio"}, "TraceIdRatioBased{1.0}"),
        ({"OTEL_TRACES_SAMPLER": "always_on"}, "AlwaysOnSampler"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, "ParentBased{root:AlwaysOffSampler"),
    ],
)
def test_the_sampler_of_processing_spans(
    env: pytest.MonkeyPatch, variables: dict[str, str], description: str
) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    assert sampler_from_env().get_description().startswith(description)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("OTEL_TRACES_EXPORTER", "jaeger", "'jaeger' is not an installed span exporter"),
        ("OTEL_TRACES_SAMPLER", "sometimes", "expected one of traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "2", "expected a number from 0 to 1"),
        ("OTEL_TRACES_SAMPLER_ARG", "half", "expected a number from 0 to 1"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "exports OTLP over http/protobuf"),
    ],
)
def test_a_value_it_cannot_use_is_a_settings_error(
    env: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    env.setenv(name, value)
    with pytest.raises(SettingsError, match=message):
        configured()
