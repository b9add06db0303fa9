"""A local OTLP/HTTP trace receiver for tests: `POST /v1/traces` with `application/x-protobuf`
(gzip-compressed or not), decoded as an `ExportTraceServiceRequest` and kept in memory.

It runs in a thread of the test process on a loopback port of its own; leaving the context
manager stops it. Each span is kept with the resource and scope that sent it, its ids in hex and
its attributes as plain Python values, so a test can assert on what a worker process exported.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True, slots=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 1 internal ... 5 consumer
    attributes: dict[str, Any]
    links: list[ReceivedLink]
    resource: dict[str, Any]
    scope: str


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(item) for item in v.array_value.values)
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    if which is None:
        return None
    return getattr(v, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    kvs: list[KeyValue] = list(pairs)
    return {kv.key: _value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one serialized `ExportTraceServiceRequest`."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                links = [
                    ReceivedLink(
                        link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes)
                    )
                    for link in s.links
                ]
                spans.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        attributes=_attributes(s.attributes),
                        links=links,
                        resource=resource,
                        scope=ss.scope.name,
                    )
                )
    return spans


@dataclass
class OtlpReceiver:
    """`endpoint` is what `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` should say; `spans()` is what
    arrived so far, in arrival order."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    requests: int = field(default=0, init=False)
    _spans: list[ReceivedSpan] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _server: ThreadingHTTPServer | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}{TRACES_PATH}"

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if name is None or s.name == name]

    def _received(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def start(self) -> Self:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.split("?")[0] != TRACES_PATH:
                    self._reply(404, b"", "text/plain")
                    return
                kind = self.headers.get("Content-Type", "").split(";")[0].strip()
                if kind != PROTOBUF:
                    self._reply(415, b"expected application/x-protobuf", "text/plain")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    encoding = self.headers.get("Content-Encoding", "").strip().lower()
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    spans = decode(body)
                except Exception as exc:  # not protobuf, or not compressed as it says
                    self._reply(400, str(exc).encode(), "text/plain")
                    return
                receiver._received(spans)
                self._reply(200, ExportTraceServiceResponse().SerializeToString(), PROTOBUF)

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: tests read `spans()`, not a request log

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="otlp", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> Self:
        return self if self._server is not None else self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
