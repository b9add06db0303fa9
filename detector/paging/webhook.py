"""A generic webhook: each new revision of a finding, POSTed as its `splitbrain.finding/v1` JSON.
Pure: requests, and the signature a receiver checks.

With a secret, `X-Splitbrain-Signature: sha256=<hex>` is the HMAC-SHA256 of the exact body under
the secret; a receiver recomputes it over the bytes it received and compares in constant time
(`verify`). `Idempotency-Key: <finding_id>/<revision>` is the same for every resend of a
revision (delivery is at least once).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from pydantic import SecretStr

from detector.paging.delivery import Request
from detector.paging.links import FindingLink
from detector.paging.state import Delivery

SIGNATURE_HEADER: Final = "X-Splitbrain-Signature"
LINK_HEADER: Final = "X-Splitbrain-Finding-Url"


def _header_value(text: str) -> str:
    """`text` if it can be an HTTP header value as it is (printable ASCII), else its hash: a
    finding id is whatever the findings topic holds."""
    if text.isascii() and text.isprintable():
        return text
    return "sha256-" + hashlib.sha256(text.encode()).hexdigest()


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(sign(secret, body), header)


@dataclass(frozen=True, slots=True)
class WebhookSink:
    url: str
    secret: SecretStr | None = None
    link: FindingLink | None = None

    def request(self, delivery: Delivery, now: datetime) -> Request:
        f = delivery.finding
        body = f.to_json().encode()
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": f"{_header_value(f.finding_id)}/{f.revision}",
            "X-Splitbrain-Finding-Id": _header_value(f.finding_id),
            "X-Splitbrain-Revision": str(f.revision),
        }
        if self.link is not None:  # percent-encoded: always a valid header value
            headers[LINK_HEADER] = self.link.of(f.finding_id)
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = sign(self.secret.get_secret_value().encode(), body)
        return Request(self.url, body, headers)
