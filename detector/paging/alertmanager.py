"""Alertmanager (API v2, `POST /api/v2/alerts`): one alert per open finding. Pure: requests only.

Labels identify an alert in Alertmanager, so they hold only what routing needs and what stays
the same for a finding at one severity: `alertname`, `severity` (`page`, `ticket`, `warning`, as
the alerting rules), `finding_id`, `workflow_key`, `condition` (its highest). When severity or
condition change, the alert under the old labels is sent ended in the same request. Group by
`finding_id` in Alertmanager's route so that those two are one notification.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlsplit

from detector.contracts.findings import Finding, Status
from detector.contracts.page_state import Sent, SinkName
from detector.paging.delivery import Request
from detector.paging.links import FindingLink
from detector.paging.state import ALERT_SEVERITY, Action, Delivery, Entry, condition_of
from detector.report import context_text, printable, witness

ALERTNAME: Final = "SplitbrainFinding"
API_PATH: Final = "/api/v2/alerts"
DEFAULT_RUNBOOK_URL: Final = "docs/operating/alerts.md#splitbrainfinding"


def timestamp(at: datetime) -> str:
    """RFC 3339 in UTC with milliseconds, as Alertmanager writes them."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def labels(finding: Finding) -> dict[str, str]:
    return {
        "alertname": ALERTNAME,
        "severity": ALERT_SEVERITY[finding.severity],
        "finding_id": finding.finding_id,
        "workflow_key": finding.workflow_key,
        "condition": condition_of(finding),
    }


def sent_labels(finding: Finding, sent: Sent) -> dict[str, str]:
    """The labels of the alert Alertmanager holds for `finding`, as `sent` records them."""
    return {
        **labels(finding),
        "severity": ALERT_SEVERITY[sent.severity],
        "condition": sent.condition,
    }


def summary(finding: Finding) -> str:
    """One line: severity, workflow, who is still acting, the highest condition, the status."""
    f = finding
    who = (
        f"epoch {f.displaced.owner_epoch} ({f.displaced.worker_id}) still acting"
        if f.displaced is not None
        else "one owner committed an effect twice"
    )
    if f.current is not None and f.displaced is not None:
        who += f" after epoch {f.current.owner_epoch} ({f.current.worker_id}) took over"
    return printable(
        f"{f.severity.value.upper()} split-brain in {f.workflow_key}: {who}; "
        f"{condition_of(f)}, {f.status.value}"
    )


def alert_annotations(
    finding: Finding, runbook_url: str, link: FindingLink | None = None
) -> dict[str, str]:
    notes = {
        "summary": summary(finding),
        "witness": printable(witness(finding)),
        "response": printable(finding.response),
        "runbook_url": runbook_url,
    }
    context = context_text(finding)
    if context:  # an annotation, never a label: the source's words are not bounded labels
        notes["context"] = printable(context)
    if link is not None:
        notes["finding_url"] = link.of(finding.finding_id)
    return notes


def alert(
    finding: Finding,
    alert_labels: dict[str, str],
    starts: datetime,
    ends: datetime | None,
    runbook_url: str,
    link: FindingLink | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "labels": alert_labels,
        "annotations": alert_annotations(finding, runbook_url, link),
        "startsAt": timestamp(starts),
    }
    if link is not None:
        doc["generatorURL"] = link.of(finding.finding_id)
    if ends is not None:
        doc["endsAt"] = timestamp(max(ends, starts))
    return doc


def endpoint(url: str) -> str:
    """`http://am:9093` or `http://am:9093/prefix` → its `/api/v2/alerts`; a URL that already
    names the endpoint is kept."""
    base = url.rstrip("/")
    return base if urlsplit(base).path.endswith(API_PATH) else base + API_PATH


@dataclass(frozen=True, slots=True)
class AlertmanagerSink:
    url: str
    runbook_url: str = DEFAULT_RUNBOOK_URL
    link: FindingLink | None = None

    def alerts(self, delivery: Delivery, now: datetime) -> list[dict[str, Any]]:
        f, prev = delivery.finding, delivery.previous
        held = (
            sent_labels(f, prev)
            if prev is not None and prev.status is Status.OPEN and prev.outcome == "accepted"
            else None
        )
        if delivery.action is Action.FIRE:
            current = labels(f)
            out = [alert(f, current, delivery.first_seen, None, self.runbook_url, self.link)]
            if held is not None and held != current:
                out.append(alert(f, held, delivery.first_seen, now, self.runbook_url, self.link))
            return out
        # Resolved when the finding's resolving revision was published (not in the future).
        ends = min(delivery.revision_at, now)
        return [alert(f, held or labels(f), delivery.first_seen, ends, self.runbook_url, self.link)]

    def request(self, delivery: Delivery, now: datetime) -> Request:
        return self._post(self.alerts(delivery, now))

    def resend(self, entries: Iterable[Entry]) -> Request:
        """The open findings again, each under the labels Alertmanager took last."""
        docs = []
        for e in entries:
            sent = e.sent.get(SinkName.ALERTMANAGER)
            held = labels(e.finding) if sent is None else sent_labels(e.finding, sent)
            docs.append(alert(e.finding, held, e.first_seen, None, self.runbook_url, self.link))
        return self._post(docs)

    def _post(self, docs: list[dict[str, Any]]) -> Request:
        body = json.dumps(docs, separators=(",", ":")).encode()
        return Request(endpoint(self.url), body, {"Content-Type": "application/json"})
