"""A local PagerDuty Events API v2 endpoint for tests: validates what the documented API requires,
keeps every request and the incidents the events make, and answers 429 or 500 on demand.

What it checks (developer.pagerduty.com, Events API v2, "Send an Alert Event"): a JSON object of
at most 512 KB; `routing_key` a non-empty string (and the expected one, when given);
`event_action` one of trigger, acknowledge, resolve; `dedup_key` a string of at most 255
characters, required to acknowledge or resolve; for a trigger, `payload` with `summary` (1 to 1024
characters), `source` (non-empty) and `severity` (critical, error, warning or info), and optional
`timestamp` (ISO 8601), `component`, `group`, `class` (strings) and `custom_details` (an object).
It answers 202 with `{"status": "success", "dedup_key": ...}`, or 400 with the errors.

Incidents follow PagerDuty's deduplication: a trigger with the dedup key of an open incident is
added to it; otherwise it opens a new incident. `incidents_opened(key)` is what a duplicate
notification would show up as.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final, Self

PATH: Final = "/v2/enqueue"
MAX_BYTES: Final = 512 * 1024
ACTIONS: Final = ("trigger", "acknowledge", "resolve")
SEVERITIES: Final = ("critical", "error", "warning", "info")


def validate(event: object, routing_key: str | None = None) -> list[str]:
    """What is wrong with an event, by the documented schema; empty when it is valid."""
    if not isinstance(event, dict):
        return ["the event is not a JSON object"]
    errors = []
    key = event.get("routing_key")
    if not isinstance(key, str) or not key:
        errors.append("routing_key: required, a non-empty string")
    elif routing_key is not None and key != routing_key:
        errors.append("routing_key: not a known integration key")
    action = event.get("event_action")
    if action not in ACTIONS:
        errors.append(f"event_action: must be one of {', '.join(ACTIONS)}")
    dedup = event.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or not 1 <= len(dedup) <= 255):
        errors.append("dedup_key: a string of 1 to 255 characters")
    if action in ("acknowledge", "resolve") and dedup is None:
        errors.append(f"dedup_key: required to {action}")
    if action == "trigger":
        errors += _payload_errors(event.get("payload"))
    return errors


def _payload_errors(payload: object) -> list[str]:
    if not isinstance(payload, dict):
        return ["payload: required for a trigger, an object"]
    errors = []
    summary = payload.get("summary")
    if not isinstance(summary, str) or not 1 <= len(summary) <= 1024:
        errors.append("payload.summary: required, 1 to 1024 characters")
    source = payload.get("source")
    if not isinstance(source, str) or not source:
        errors.append("payload.source: required, a non-empty string")
    if payload.get("severity") not in SEVERITIES:
        errors.append(f"payload.severity: must be one of {', '.join(SEVERITIES)}")
    stamp = payload.get("timestamp")
    if stamp is not None:
        try:
            datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            errors.append("payload.timestamp: not an ISO 8601 time")
    for name in ("component", "group", "class"):
        if name in payload and not isinstance(payload[name], str):
            errors.append(f"payload.{name}: a string")
    if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
        errors.append("payload.custom_details: an object")
    return errors


@dataclass(frozen=True, slots=True)
class Received:
    """One request: when (monotonic), what it held, and what it was answered."""

    at: float
    status: int
    event: dict[str, Any] | None
    errors: tuple[str, ...]


@dataclass(slots=True)
class Incident:
    dedup_key: str
    status: str  # triggered, acknowledged, resolved
    opened: int = 1  # how many times an event opened it (more than 1: a duplicate incident)
    events: list[dict[str, Any]] = field(default_factory=list)


class PagerDutyReceiver:
    """`url` is the enqueue endpoint; a context manager that serves on 127.0.0.1."""

    def __init__(self, routing_key: str | None = None) -> None:
        self.routing_key = routing_key
        self.requests: list[Received] = []
        self.incidents: dict[str, Incident] = {}
        self._answers: list[int] = []  # statuses to answer next, before validating
        self._refuse: dict[str, int] = {}  # dedup_key -> status, every time
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status, answer = receiver._handle(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{PATH}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---- control ------------------------------------------------------------------------------

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def fail_next(self, status: int, times: int = 1) -> None:
        """Answer the next `times` requests with `status` (429, 500, …), whatever they hold."""
        with self._lock:
            self._answers += [status] * times

    def refuse(self, dedup_key: str, status: int = 400) -> None:
        """Answer every event for `dedup_key` with `status`, as PagerDuty answers one it cannot
        take."""
        with self._lock:
            self._refuse[dedup_key] = status

    def recover(self) -> None:
        """Answer every request on its merits again."""
        with self._lock:
            self._answers.clear()
            self._refuse.clear()

    # ---- what it saw --------------------------------------------------------------------------

    def accepted(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.event for r in self.requests if r.status == 202 and r.event is not None]

    def attempts(self, dedup_key: str) -> list[Received]:
        with self._lock:
            return [
                r
                for r in self.requests
                if r.event is not None and r.event.get("dedup_key") == dedup_key
            ]

    def incident(self, dedup_key: str) -> Incident | None:
        with self._lock:
            return self.incidents.get(dedup_key)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.05)

    # ---- the endpoint -------------------------------------------------------------------------

    def _handle(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        event: dict[str, Any] | None = None
        with self._lock:
            if path != PATH:
                return self._record(now, 404, None, ("no such endpoint",))
            try:
                parsed = json.loads(body)
            except ValueError:
                return self._record(now, 400, None, ("the body is not JSON",))
            event = parsed if isinstance(parsed, dict) else None
            if self._answers:
                status = self._answers.pop(0)
                return self._record(now, status, event, (f"answered {status} on demand",))
            errors = list(validate(parsed, self.routing_key))
            if len(body) > MAX_BYTES:
                errors.append(f"the event is {len(body)} bytes, more than {MAX_BYTES}")
            if errors:
                return self._record(now, 400, event, tuple(errors))
            assert event is not None
            key = str(event.get("dedup_key") or f"generated-{len(self.incidents)}")
            if key in self._refuse:
                return self._record(now, self._refuse[key], event, ("refused on demand",))
            self._apply(key, event)
            self.requests.append(Received(now, 202, event, ()))
            return 202, {"status": "success", "message": "Event processed", "dedup_key": key}

    def _record(
        self, now: float, status: int, event: dict[str, Any] | None, errors: tuple[str, ...]
    ) -> tuple[int, dict[str, Any]]:
        self.requests.append(Received(now, status, event, errors))
        return status, {"status": "invalid event", "message": "rejected", "errors": list(errors)}

    def _apply(self, key: str, event: dict[str, Any]) -> None:
        action = event["event_action"]
        incident = self.incidents.get(key)
        if action == "trigger":
            if incident is None:
                self.incidents[key] = Incident(key, "triggered", events=[event])
                return
            if incident.status == "resolved":
                incident.opened += 1
            incident.status = "triggered"
        elif incident is None:
            return  # PagerDuty accepts and ignores an event for no open incident
        else:
            incident.status = "acknowledged" if action == "acknowledge" else "resolved"
        incident.events.append(event)
