"""Posting to a sink, and what its answer means: accepted, retry later, or never (a dead letter).

- 2xx: accepted.
- 429, 408, 5xx, and no answer at all (refused, reset, timed out, DNS): the sink may take it
  later; retried with exponential backoff and jitter, for as long as it takes (a sink that is
  down holds the bridge's offsets back and loses nothing). A `Retry-After` in seconds is honoured.
- Any other status (400, 401, 403, 404, 413, a redirect): sending the same request again cannot
  succeed; it becomes a dead letter (one log line with the status) instead of an endless loop.

stdlib `urllib`: the bridge makes a few requests per finding, and adds no dependency for them.
"""

from __future__ import annotations

import http.client
import random
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final
from urllib.parse import urlsplit

from detector.backoff import equal_jitter

USER_AGENT: Final = "splitbrain-page/1"
_DETAIL_CHARS: Final = 300


@dataclass(frozen=True, slots=True)
class Request:
    url: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class DeliveryOutcome(StrEnum):
    """What a sink's answer means for a delivery: the `outcome` label of
    `splitbrain_page_deliveries_total`."""

    ACCEPTED = "accepted"
    RETRIED = "retried"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class Answer:
    outcome: DeliveryOutcome
    status: int | None  # None: no HTTP answer
    detail: str  # the reason, for a log line (the start of the body of an error answer)
    retry_after: float | None = None


def classify(status: int) -> DeliveryOutcome:
    if 200 <= status < 300:
        return DeliveryOutcome.ACCEPTED
    if status in (408, 429) or status >= 500:
        return DeliveryOutcome.RETRIED
    return DeliveryOutcome.DEAD_LETTER


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides
    return seconds if seconds is not None and 0 <= seconds <= 3600 else None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib would follow a 301/302/303 to a POST with a GET, without the body, and take the
    answer to that for acceptance. A sink URL that redirects is a misconfiguration: its 3xx is
    a dead letter."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER: Final = urllib.request.build_opener(_NoRedirect)


def post(request: Request, timeout: float) -> Answer:
    """POST `request` once; never raises for what the network or the sink does."""
    req = urllib.request.Request(
        request.url,
        data=request.body,
        headers={"User-Agent": USER_AGENT, **request.headers},
        method="POST",
    )
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            resp.read()
            status = resp.status
            return Answer(classify(status), status, resp.reason or "")
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read(_DETAIL_CHARS).decode("utf-8", "replace")
        except OSError:
            text = ""
        return Answer(
            classify(exc.code),
            exc.code,
            " ".join(f"{exc.reason} {text}".split()),
            _retry_after(exc.headers.get("Retry-After") if exc.headers else None),
        )
    except urllib.error.URLError as exc:
        return Answer(DeliveryOutcome.RETRIED, None, f"no answer: {exc.reason}")
    except (OSError, http.client.HTTPException) as exc:
        return Answer(DeliveryOutcome.RETRIED, None, f"no answer: {type(exc).__name__}: {exc}")
    except ValueError as exc:  # a request http.client refuses to send: it never will
        return Answer(DeliveryOutcome.DEAD_LETTER, None, f"cannot be sent: {exc}")


@dataclass(frozen=True, slots=True)
class Backoff:
    """`detector.backoff.equal_jitter`: the n-th retry waits between half and all of
    `initial * 2^(n-1)`, at most `maximum`, or longer where the sink's `Retry-After` says so."""

    initial: float
    maximum: float

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        wait = equal_jitter(attempt, self.initial, self.maximum, rng.random())
        return max(wait, retry_after) if retry_after is not None else wait


def origin(url: str) -> str:
    """`scheme://host:port` of a URL, for log lines: never its user, password, path or query,
    which can hold credentials."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret replaced, in case a sink echoed one in an error answer."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
