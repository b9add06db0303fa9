"""OpenTelemetry traces of a detector worker: one span per finding revision, linked to the spans
that emitted its evidence, and sampled processing spans per batch of input records.

Configured only by the standard `OTEL_*` environment variables, read when the worker starts
(`WorkerTracing.from_env`). Nothing is exported, and nothing is traced, unless an exporter is
asked for: `OTEL_TRACES_EXPORTER` (`otlp` over http/protobuf, `console`, or a
`opentelemetry_traces_exporter` entry point), or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), which implies `otlp`.
`OTEL_SDK_DISABLED=true` turns it all off. The OTLP exporter, the batch span processor
(`OTEL_BSP_*`) and the resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) read their own
variables, as the SDK documents them.

Sampling. `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` choose the sampler of the
processing spans; unset, it is `parentbased_traceidratio` at 0.01 (one batch in a hundred). A
finding span is always sampled: findings are rare, and each is the reason someone opens a trace.

The samplers and exporters are the SDK's, found by name in its entry points; the variables are
read here, not by the SDK's environment configuration (`opentelemetry-instrument`'s, private):
that one warns and falls back on a value it cannot use, where a worker refuses to start.

Where the trace context of an event is kept, so that a finding revision can link to it (the
engine stays pure and knows nothing of OpenTelemetry):

- `detector.runtime.intake.admit` gives an event the context of its record's `traceparent`
  header (else the event keeps its own `trace_id`/`span_id`). The engine already keeps that
  context on the evidence and condition records it retains anyway, and renders those of the
  conditions a finding lists as the finding's `trace_links`: durable (in the changelog state,
  so they survive restores and rebalances) and bounded by the engine's own caps, at no cost.
- The engine keeps no context for an acquisition (a finding's `transition`), and a finding's
  `last_stale_event` is not always one of its listed conditions. For those, `PartitionTracing`
  remembers the contexts of the partition's recent events in two FIFO maps, one for
  acquisitions and one for the other kinds, keyed by a hash of (workflow key, event id), each
  holding at most `RECENT_EVENTS` entries (about 230 bytes each: under 2 MB per partition). O(1)
  per event, and only while tracing is on. These links are best effort: an acquisition older
  than the partition's last `RECENT_EVENTS` acquisitions, or one processed before a restore,
  gives no link.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
    OTEL_TRACES_SAMPLER,
    OTEL_TRACES_SAMPLER_ARG,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, Span, SpanContext, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from detector.contracts.events import Kind, OwnershipEvent
from detector.contracts.findings import Finding
from detector.core import FindingUpdate
from detector.settings import SettingsError
from detector.telemetry.trace_context import Headers, traceparent

log = logging.getLogger(__name__)

FINDING_SPAN: Final = "splitbrain.finding"
DEFAULT_SAMPLER: Final = "parentbased_traceidratio"
DEFAULT_RATIO: Final = 0.01
RECENT_EVENTS: Final = 4096  # trace contexts remembered per partition, per map
PROCESS_LINKS: Final = 32  # links from a processing span to its records' creation contexts
SERVICE_NAME: Final = "splitbrain-detector"

_SAMPLERS: Final = "opentelemetry_traces_sampler"
_EXPORTERS: Final = "opentelemetry_traces_exporter"
_RATIO_SAMPLERS: Final = ("traceidratio", "parentbased_traceidratio")  # their argument: a ratio
# The SDK's OTLP exporters by OTEL_EXPORTER_OTLP_PROTOCOL; the package installs http/protobuf.
_OTLP_BY_PROTOCOL: Final = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_ROOT: Final = Context()  # no parent: a span started in it begins a new trace


class FindingsSampled(Sampler):
    """Every finding span is sampled; any other span as `base` decides."""

    def __init__(self, base: Sampler) -> None:
        self.base = base

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if name == FINDING_SPAN:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return self.base.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"FindingsSampled{{{self.base.get_description()}}}"


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _installed(group: str, name: str) -> Any:
    """What entry point `name` of `group` loads (None if no package installs it): the SDK
    registers its own samplers and exporters there, as other packages add theirs."""
    found = entry_points(group=group, name=name)
    return next(iter(found)).load() if found else None


def sampler_from_env() -> Sampler:
    """The processing spans' sampler from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`:
    by default `parentbased_traceidratio` at `DEFAULT_RATIO`; a ratio sampler named without an
    argument samples everything, as the specification says."""
    named = _env(OTEL_TRACES_SAMPLER).lower()
    arg = _env(OTEL_TRACES_SAMPLER_ARG)
    name = named or DEFAULT_SAMPLER
    factory = _installed(_SAMPLERS, name)
    if factory is None:
        others = sorted({e.name for e in entry_points(group=_SAMPLERS)} - set(_RATIO_SAMPLERS))
        known = ", ".join([*_RATIO_SAMPLERS, *others])
        raise SettingsError(f"{OTEL_TRACES_SAMPLER}={named!r}: expected one of {known}")
    sampler: Sampler = factory(
        _ratio(arg, 1.0 if named else DEFAULT_RATIO) if name in _RATIO_SAMPLERS else arg or None
    )
    return sampler


def _ratio(arg: str, default: float) -> float:
    if not arg:
        return default
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise SettingsError(f"{OTEL_TRACES_SAMPLER_ARG}={arg!r}: expected a number from 0 to 1")
    return ratio


def exporters_from_env() -> list[SpanExporter]:
    """The span exporters `OTEL_TRACES_EXPORTER` names (a comma-separated list); unset, `otlp`
    when an OTLP endpoint is set, else none. `none` names no exporter."""
    names = _env(OTEL_TRACES_EXPORTER).lower()
    if not names:
        endpoints = (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
        names = "otlp" if any(_env(v) for v in endpoints) else "none"
    exporters: list[SpanExporter] = []
    for name in dict.fromkeys(n.strip() for n in names.split(",")):
        if name in ("none", ""):
            continue
        exporter = _otlp_exporter() if name == "otlp" else _installed(_EXPORTERS, name)
        if exporter is None:
            raise SettingsError(
                f"{OTEL_TRACES_EXPORTER}={names!r}: {name!r} is not an installed span exporter "
                "(otlp, console, none, or an opentelemetry_traces_exporter entry point)"
            )
        exporters.append(exporter())
    return exporters


def _otlp_exporter() -> type[SpanExporter]:
    """The SDK's OTLP exporter for the protocol asked for; http/protobuf unless another is."""
    variable = OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    if not _env(variable):
        variable = OTEL_EXPORTER_OTLP_PROTOCOL
    protocol = _env(variable) or "http/protobuf"
    exporter: type[SpanExporter] | None = _installed(
        _EXPORTERS, _OTLP_BY_PROTOCOL.get(protocol, "")
    )
    if exporter is None:
        raise SettingsError(
            f"{variable}={protocol!r}: the worker exports OTLP over http/protobuf (install "
            "opentelemetry-exporter-otlp-proto-grpc for grpc)"
        )
    return exporter


def _span_context(trace: str) -> SpanContext | None:
    """The context of an engine's trace reference, `<trace id>-<span id>` in hex (an event
    that gave a trace id without a span id has none)."""
    trace_id, _, span_id = trace.partition("-")
    try:
        context = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True)
    except ValueError:
        return None
    return context if context.is_valid else None


class WorkerTracing:
    """A worker's tracer and the processing spans open in its current batch; `off()` when no
    exporter is configured, and then every method is (nearly) free."""

    def __init__(
        self, provider: TracerProvider | None, *, topic: str = "", group: str = ""
    ) -> None:
        self.provider = provider
        self.tracer = None if provider is None else provider.get_tracer("detector.runtime")
        self.topic = topic
        self.group = group
        self.processing: dict[int, Span] = {}  # input partition -> its open processing span

    @classmethod
    def off(cls) -> WorkerTracing:
        return cls(None)

    @classmethod
    def from_env(cls, *, topic: str, group: str, instance: str) -> WorkerTracing:
        """As the `OTEL_*` variables say (see the module); raises `SettingsError` for a value
        it cannot use. `instance` is the worker's instance id (`service.instance.id`)."""
        if _env(OTEL_SDK_DISABLED).lower() == "true":
            return cls.off()
        exporters = exporters_from_env()
        if not exporters:
            return cls.off()
        sampler = FindingsSampled(sampler_from_env())
        # Ours unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES give them.
        given = OTELResourceDetector().detect().attributes
        defaults = {"service.name": SERVICE_NAME, "service.instance.id": instance}
        resource = Resource.create({k: v for k, v in defaults.items() if k not in given})
        provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info(
            "tracing on: exporting spans with %s, sampler %s",
            ", ".join(type(e).__name__ for e in exporters),
            sampler.get_description(),
        )
        return cls(provider, topic=topic, group=group)

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def partition(self, partition: int) -> PartitionTracing | None:
        """What an input partition's processor traces with; None when tracing is off."""
        return None if self.tracer is None else PartitionTracing(self, partition)

    def batch(self) -> ProcessingSpans:
        """The processing spans of a batch of records about to be processed; `end` it."""
        return _NO_SPANS if self.tracer is None else ProcessingSpans(self)

    def shutdown(self) -> None:
        """Export what is buffered (within `OTEL_BSP_EXPORT_TIMEOUT`) and stop."""
        if self.provider is not None:
            self.provider.shutdown()


class ProcessingSpans:
    """The processing spans of one batch (OpenTelemetry messaging conventions): one `process
    <topic>` span per input partition the batch holds, from its first record to the end of the
    batch, with the batch's size, and links to the first records' creation contexts (their
    `traceparent`) when it is sampled. The finding spans of a sampled one are its children."""

    __slots__ = ("_counts", "_links", "_tracing")

    def __init__(self, tracing: WorkerTracing | None) -> None:
        self._tracing = tracing
        self._counts: dict[int, int] = {}
        self._links: dict[int, int] = {}

    def add(self, partition: int, headers: Headers) -> None:
        """A record of `partition` is about to be processed."""
        tracing = self._tracing
        if tracing is None or tracing.tracer is None:
            return
        count = self._counts.get(partition)
        if count is None:
            tracing.processing[partition] = tracing.tracer.start_span(
                f"process {tracing.topic}",
                _ROOT,  # a batch is no record's child: it links to them
                SpanKind.CONSUMER,
                {
                    "messaging.system": "kafka",
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "messaging.destination.name": tracing.topic,
                    "messaging.consumer.group.name": tracing.group,
                    "messaging.destination.partition.id": str(partition),
                },
            )
            count = 0
        self._counts[partition] = count + 1
        span = tracing.processing[partition]
        if headers and span.is_recording() and self._links.get(partition, 0) < PROCESS_LINKS:
            context = traceparent(headers)
            if context is not None:
                link = _span_context("-".join(context))
                if link is not None:
                    span.add_link(link)
                    self._links[partition] = self._links.get(partition, 0) + 1

    def end(self) -> None:
        tracing = self._tracing
        if tracing is None:
            return
        for partition, count in self._counts.items():
            span = tracing.processing.pop(partition, None)
            if span is not None:
                span.set_attribute("messaging.batch.message_count", count)
                span.end()
        self._counts.clear()


_NO_SPANS: Final = ProcessingSpans(None)


class PartitionTracing:
    """One input partition's finding spans, and the trace contexts of its recent events (see
    the module: where contexts are kept, and how much)."""

    __slots__ = ("_acquisitions", "_capacity", "_events", "_worker", "partition")

    def __init__(
        self, worker: WorkerTracing, partition: int, capacity: int = RECENT_EVENTS
    ) -> None:
        self._worker = worker
        self.partition = partition
        self._capacity = capacity
        # hash((workflow_key, event_id)) -> "<trace id>-<span id>", oldest first
        self._events: OrderedDict[int, str] = OrderedDict()
        self._acquisitions: OrderedDict[int, str] = OrderedDict()

    def remember(self, event: OwnershipEvent) -> None:
        """An admitted event, before the engine sees it (its own revision may link to it)."""
        span_id = event.span_id
        trace_id = event.trace_id
        if span_id is None or trace_id is None:
            return
        recent = self._acquisitions if event.kind is Kind.LEASE_ACQUIRED else self._events
        recent[hash((event.workflow_key, event.event_id))] = f"{trace_id}-{span_id}"
        if len(recent) > self._capacity:
            recent.popitem(last=False)

    def finding(self, update: FindingUpdate) -> str | None:
        """Record the span of one finding revision; its trace id (hex) when it is sampled."""
        tracer = self._worker.tracer
        if tracer is None:
            return None
        f = update.finding
        parent = self._worker.processing.get(self.partition)
        context = (
            trace.set_span_in_context(parent)
            if parent is not None and parent.get_span_context().trace_flags.sampled
            else _ROOT
        )
        span = tracer.start_span(
            FINDING_SPAN, context, SpanKind.INTERNAL, _attributes(update), self._links(f)
        )
        span.end()
        sc = span.get_span_context()
        return f"{sc.trace_id:032x}" if sc.trace_flags.sampled else None

    def _links(self, f: Finding) -> list[Link]:
        """To the events a finding references: its transition, the witnesses of its listed
        conditions and its last stale event (each once, with every role it plays), then any
        context of its `trace_links` (the engine's, which survive restores) not linked yet."""
        workflow = f.workflow_key
        witnesses: dict[str, tuple[str | None, list[str]]] = {}

        def witness(trace: str | None, event_id: str | None, role: str) -> None:
            if trace is None:
                return
            seen = witnesses.get(trace)
            if seen is None:
                witnesses[trace] = (event_id, [role])
            elif role not in seen[1]:
                seen[1].append(role)

        if f.transition is not None:
            key = hash((workflow, f.transition.event_id))
            witness(self._acquisitions.get(key), f.transition.event_id, "transition")
        for c in f.conditions:
            key = hash((workflow, c.event_id))
            witness(self._events.get(key), c.event_id, c.kind.value)
        if f.last_stale_event is not None:
            key = hash((workflow, f.last_stale_event.event_id))
            witness(self._events.get(key), f.last_stale_event.event_id, "last_stale_event")
        for known in f.trace_links:
            if known not in witnesses:
                witness(known, None, "condition")
        links: list[Link] = []
        for trace_ref, (event_id, roles) in witnesses.items():
            context = _span_context(trace_ref)
            if context is None:
                continue
            attributes: dict[str, Any] = {"splitbrain.witness": tuple(roles)}
            if event_id is not None:
                attributes["splitbrain.event.id"] = event_id
            links.append(Link(context, attributes))
        return links


def _attributes(update: FindingUpdate) -> dict[str, Any]:
    f = update.finding
    attributes: dict[str, Any] = {
        "splitbrain.finding.id": f.finding_id,
        "splitbrain.finding.revision": f.revision,
        "splitbrain.finding.severity": f.severity.value,
        "splitbrain.finding.status": f.status.value,
        "splitbrain.finding.confidence": f.confidence,
        "splitbrain.finding.escalated": update.escalated,
        "splitbrain.finding.conditions": tuple(dict.fromkeys(c.kind.value for c in f.conditions)),
        "splitbrain.workflow.key": f.workflow_key,
    }
    if f.displaced is not None:
        attributes["splitbrain.displaced.epoch"] = f.displaced.owner_epoch
        attributes["splitbrain.displaced.worker_id"] = f.displaced.worker_id
    if f.current is not None:
        attributes["splitbrain.current.epoch"] = f.current.owner_epoch
        attributes["splitbrain.current.worker_id"] = f.current.worker_id
    return attributes
