"""A small HTTP service in front of a `FencedDestination`: the example destination of the demo,
served by `splitbrain leases destination` (`detector.cli.leases`, which reads its settings).

`POST /effects/<entity>` with a JSON object (the effect's payload, at most 16 KiB) and the
headers a worker sends with each tool request (`detector.leases.runner.ToolCall.headers`):
`X-Execution-Fence` (the fencing token), `Idempotency-Key`, `X-Execution-Job` (the job's uuid),
`X-Execution-Worker`; optionally `X-Execution-Attempt` and `X-Effect-Key` (default: the
idempotency key). The payload is recorded as one row of `fenced_effects`. Answers, each JSON:

- 200 and the receipt: accepted, or the stored receipt of an accepted request with the same key
  (`"status": "repeated"`);
- 409 and the receipt: rejected for a stale fence (or the stored rejection, repeated);
- 400 naming the header or field that is missing or invalid (`{"error", "field", "reason"}`);
  404 for an unknown job (or path); 405 for a method other than POST; 413 for a body over the
  limit; 422 for an idempotency key already used for another entity or effect key; 503 when
  the database does not answer (whether it committed is unknown: send the same request again).

Logs carry technical ids, hashes and codes only, never the payload.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from detector.closing import Started
from detector.leases.db import one_line
from detector.leases.destination import (
    EffectRequest,
    FencedDestination,
    IdempotencyKeyReusedError,
    UnknownJobError,
)
from detector.leases.errors import LeaseInputError, StoreUnavailableError
from detector.leases.runner import FENCE_HEADER, IDEMPOTENCY_HEADER, JOB_HEADER, WORKER_HEADER

log = logging.getLogger(__name__)

ATTEMPT_HEADER: Final = "X-Execution-Attempt"
EFFECT_KEY_HEADER: Final = "X-Effect-Key"
MAX_BODY_BYTES: Final = 16 * 1024
DEFAULT_NAME: Final = "example-destination"
PATH_PREFIX: Final = "/effects/"
# Where each field of an `EffectRequest` comes from, to name it in a 400.
_SOURCES: Final = {
    "job_id": JOB_HEADER,
    "worker_id": WORKER_HEADER,
    "fence": FENCE_HEADER,
    "idempotency_key": IDEMPOTENCY_HEADER,
    "entity": "entity",
    "effect_key": EFFECT_KEY_HEADER,
    "attempt": ATTEMPT_HEADER,
}
_REQUIRED: Final = (JOB_HEADER, WORKER_HEADER, FENCE_HEADER, IDEMPOTENCY_HEADER)
_BORROW_TIMEOUT_S: Final = 10.0


def content_length(text: str | None) -> int | None:
    """A Content-Length header's value, or None when it is missing or not ASCII digits (RFC 9110:
    `1*DIGIT`; `str.isdigit` and `int` also take `²` and `٣`)."""
    if text is None or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


class _Refused(Exception):  # noqa: N818 - an HTTP answer other than a receipt
    def __init__(self, status: HTTPStatus, error: str, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.body: dict[str, Any] = {"error": error, "field": field, "reason": reason}


class _Pool:
    """At most `size` destinations (one connection each), each used by one request at a time."""

    def __init__(self, dsn: str, name: str, *, fenced: bool, size: int) -> None:
        self._dsn, self._name, self._fenced = dsn, name, fenced
        self._free: queue.LifoQueue[FencedDestination] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        # The first connection now: an unmigrated database, or one that does not answer, is
        # refused when the service starts rather than on each request.
        self._free.put(self._new())

    def _new(self) -> FencedDestination:
        return FencedDestination(self._dsn, self._name, fenced=self._fenced)

    @contextlib.contextmanager
    def borrow(self) -> Iterator[FencedDestination]:
        if not self._slots.acquire(timeout=_BORROW_TIMEOUT_S):
            raise StoreUnavailableError("every connection of the destination is busy")
        try:
            try:
                destination = self._free.get_nowait()
            except queue.Empty:
                destination = self._new()
            try:
                yield destination
            finally:
                self._free.put(destination)
        finally:
            self._slots.release()

    def close(self) -> None:
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                return


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length

    def do_POST(self) -> None:
        try:
            raw = self._body()  # first: a refused request's body must not be left unread
            request = self._request(self._entity())
            payload = self._payload(raw)
            with self.server.pool.borrow() as destination:
                receipt = destination.apply(request, payload)
        except _Refused as refused:
            self._answer(refused.status, refused.body)
            return
        except UnknownJobError as exc:
            self._answer(HTTPStatus.NOT_FOUND, _error("unknown_job", JOB_HEADER, exc.reason))
            return
        except IdempotencyKeyReusedError as exc:
            body = _error("idempotency_key_reused", IDEMPOTENCY_HEADER, exc.reason)
            self._answer(HTTPStatus.UNPROCESSABLE_ENTITY, body)
            return
        except LeaseInputError as exc:
            self._answer(HTTPStatus.BAD_REQUEST, _error("bad_request", "body", exc.reason))
            return
        except StoreUnavailableError as exc:
            log.warning("unavailable path=%s error=%s", self._route(), one_line(exc))
            body = _error("unavailable", None, "the database did not answer: retry")
            self._answer(HTTPStatus.SERVICE_UNAVAILABLE, body)
            return
        except Exception as exc:
            # The type only: a message could quote what was sent.
            log.error("failed path=%s error=%s", self._route(), type(exc).__name__)
            body = _error("internal", None, type(exc).__name__)
            self._answer(HTTPStatus.INTERNAL_SERVER_ERROR, body)
            return
        self._answer(HTTPStatus.OK if receipt.accepted else HTTPStatus.CONFLICT, receipt.to_json())

    def do_GET(self) -> None:
        self._not_allowed()

    def do_PUT(self) -> None:
        self._not_allowed()

    def do_PATCH(self) -> None:
        self._not_allowed()

    def do_DELETE(self) -> None:
        self._not_allowed()

    def _not_allowed(self) -> None:
        self.close_connection = True  # its body, if any, is not read
        body = _error("method_not_allowed", None, f"{self.command}: only POST {PATH_PREFIX}<x>")
        self._answer(HTTPStatus.METHOD_NOT_ALLOWED, body, {"Allow": "POST"})

    # -- the request ----------------------------------------------------------------------

    def _route(self) -> str:
        return urlsplit(self.path).path

    def _entity(self) -> str:
        path = self._route()
        if not path.startswith(PATH_PREFIX):
            raise _Refused(HTTPStatus.NOT_FOUND, "not_found", None, f"no route {path[:64]!r}")
        try:
            return unquote(path.removeprefix(PATH_PREFIX), errors="strict")
        except UnicodeDecodeError:
            reason = "not UTF-8 once percent-decoded"
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", "entity", reason) from None

    def _header(self, name: str) -> str | None:
        values = self.headers.get_all(name) or []
        if len(values) > 1:
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", name, "given more than once")
        return values[0] if values else None

    def _request(self, entity: str) -> EffectRequest:
        fields: dict[str, Any] = {"entity": entity}
        for field, name in _SOURCES.items():
            if name == "entity":
                continue
            value = self._header(name)
            if value is None and name in _REQUIRED:
                raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", name, "missing")
            if value is not None:
                fields[field] = value
        try:
            return EffectRequest.model_validate(fields)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = str(first["loc"][0]) if first["loc"] else ""
            reason = (
                "must not contain control characters"
                if first["type"] == "string_pattern_mismatch"
                else first["msg"]
            )
            raise _Refused(
                HTTPStatus.BAD_REQUEST, "bad_request", _SOURCES.get(field, field), reason
            ) from None

    def _body(self) -> bytes:
        """The body, read whole; a request whose body is not read closes its connection."""
        asked_to_close, self.close_connection = self.close_connection, True
        if self.headers.get("Transfer-Encoding") is not None:
            reason = "send a Content-Length, not Transfer-Encoding"
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", "Content-Length", reason)
        length = content_length(self._header("Content-Length"))
        if length is None:
            reason = "missing or not a number"
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", "Content-Length", reason)
        limit = self.server.max_body_bytes
        if length > limit:
            reason = f"{length} bytes; the limit is {limit}"
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large", "body", reason)
        raw = self.rfile.read(length)
        self.close_connection = asked_to_close or len(raw) != length
        return raw

    def _payload(self, raw: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            payload = None
        if not isinstance(payload, dict):
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", "body", "not a JSON object")
        return payload

    # -- the answer -----------------------------------------------------------------------

    def _answer(
        self, status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """The stdlib's access line quotes the request line; the destination logs its own."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.debug("http %s %s status=%s", self.command, self._route()[:300], code)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], pool: _Pool, max_body_bytes: int) -> None:
        self.pool = pool
        self.max_body_bytes = max_body_bytes
        super().__init__(address, _Handler)


def _error(error: str, field: str | None, reason: str) -> dict[str, Any]:
    return {"error": error, "field": field, "reason": reason}


class DestinationServer(Started):
    """The service on `host:port` (port 0: a free one, then `port` says which), serving on a
    thread of its own for the `with` block. `connections` bounds the database connections it
    opens (one per request in flight)."""

    def __init__(
        self,
        dsn: str,
        name: str = DEFAULT_NAME,
        *,
        fenced: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        connections: int = 4,
    ) -> None:
        self._pool = _Pool(dsn, name, fenced=fenced, size=connections)
        self._address = (host, port)
        self._max_body_bytes = max_body_bytes
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = _Server(self._address, self._pool, self._max_body_bytes)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fenced-destination", daemon=True
        )
        self._thread.start()
        log.info("listening on %s", self.url)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None
        self._pool.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._address[0]}:{self.port}"
