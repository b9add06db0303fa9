"""PagerDuty Events API v2 (`POST https://events.pagerduty.com/v2/enqueue`). Pure: requests only.

`dedup_key` is the finding id, so every event of a finding lands on one incident however often
the bridge sends it (at least once): `trigger` when the finding opens, escalates or reopens,
`resolve` when it resolves. The routing key is a secret: it is in the request body only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pydantic import SecretStr

from detector.contracts.findings import Finding
from detector.paging.alertmanager import DEFAULT_RUNBOOK_URL, summary, timestamp
from detector.paging.delivery import Request
from detector.paging.links import FindingLink
from detector.paging.state import Action, Delivery, condition_of
from detector.report import printable, witness

DEFAULT_URL: Final = "https://events.pagerduty.com/v2/enqueue"
MAX_SUMMARY: Final = 1024
MAX_DEDUP_KEY: Final = 255
MAX_SOURCE: Final = 255
MAX_EVENT_BYTES: Final = 512 * 1024
# Ours map one to one; PagerDuty's `error` is not used.
SEVERITY: Final = {"critical": "critical", "warning": "warning", "info": "info"}


def dedup_key(finding_id: str) -> str:
    """The finding id; one longer than PagerDuty's 255 characters is replaced by its hash."""
    if len(finding_id) <= MAX_DEDUP_KEY:
        return finding_id
    return "sb-sha256-" + hashlib.sha256(finding_id.encode()).hexdigest()


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def custom_details(finding: Finding, runbook_url: str) -> dict[str, Any]:
    f = finding
    details: dict[str, Any] = {
        "finding_id": f.finding_id,
        "revision": f.revision,
        "status": f.status.value,
        "workflow_key": f.workflow_key,
        "condition": condition_of(f),
        "witness": printable(witness(f)),
        "response": printable(f.response),
        "displaced_epoch": f.displaced.owner_epoch if f.displaced else None,
        "displaced_worker": f.displaced.worker_id if f.displaced else None,
        "current_epoch": f.current.owner_epoch if f.current else None,
        "current_worker": f.current.worker_id if f.current else None,
        "epochs": sorted({e for c in f.conditions for e in c.epochs or []}),
        "effect_keys": f.effect_keys,
        "effect_keys_omitted": f.effect_keys_omitted,
        "conditions": [c.kind.value for c in f.conditions],
        "confidence": f.confidence,
        "ordering": f.ordering,
        "sink_outcome": f.sink_outcome,
        "evidence_truncated": f.evidence_truncated,
        "runbook_url": runbook_url,
    }
    if f.context is not None:  # the source system's words, by side (DESIGN §5 `context`)
        details["context"] = {
            side: {printable(k): printable(v) for k, v in words.items()}
            for side, words in f.context.model_dump(exclude_none=True).items()
        }
    return details


@dataclass(frozen=True, slots=True)
class PagerDutySink:
    routing_key: SecretStr
    url: str = DEFAULT_URL
    runbook_url: str = DEFAULT_RUNBOOK_URL
    link: FindingLink | None = None

    def event(self, delivery: Delivery) -> dict[str, Any]:
        f = delivery.finding
        doc: dict[str, Any] = {
            "routing_key": self.routing_key.get_secret_value(),
            "event_action": "resolve" if delivery.action is Action.RESOLVE else "trigger",
            "dedup_key": dedup_key(f.finding_id),
        }
        if delivery.action is Action.RESOLVE:
            return doc
        doc["client"] = "splitbrain"
        if self.link is not None:
            doc["links"] = [{"href": self.link.of(f.finding_id), "text": "the finding"}]
        doc["payload"] = {
            "summary": _cut(summary(f), MAX_SUMMARY),
            "source": _cut(printable(f.workflow_key), MAX_SOURCE) or "splitbrain",
            "severity": SEVERITY[f.severity.value],
            "timestamp": timestamp(delivery.first_seen),
            "component": "splitbrain",
            "class": condition_of(f),
            "custom_details": custom_details(f, self.runbook_url),
        }
        if len(json.dumps(doc).encode()) > MAX_EVENT_BYTES:
            # Findings are a few KiB (bounded lists), so this is a guard, not a path: keep what
            # the on-call human reads first.
            details = doc["payload"]["custom_details"]
            details["effect_keys"] = details["effect_keys"][:1]
            details["witness"] = _cut(details["witness"], 4096)
            details["response"] = _cut(details["response"], 4096)
        return doc

    def request(self, delivery: Delivery, now: datetime) -> Request:
        body = json.dumps(self.event(delivery), separators=(",", ":")).encode()
        return Request(self.url, body, {"Content-Type": "application/json"})
