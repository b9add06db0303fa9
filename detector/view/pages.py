"""The view's pages, rendered on the server: findings in, HTML out (no I/O, no framework).

The templates (`templates/`, on the report's shell) escape every value from the topic and make
its controls visible (`detector.timeline.markup`), every link to a finding percent-encodes its
id, and the pages carry no script at all. A page shows what a finding holds (ids, keys, hashes),
nothing more: the view never reads events or payloads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final
from urllib.parse import quote

from detector.contracts.findings import Finding, Severity, Status
from detector.timeline.markup import environment
from detector.timeline.svg import draw
from detector.view.store import Filters

DRAWN_FROM: Final = (
    "Drawn from the finding alone: both owners' lanes, the takeover and the event of each "
    "condition, placed by seq (by the finding's order where an event has none). What the "
    "finding does not hold is not drawn: the owners' other events, the fences, releases and "
    "verifications. splitbrain audit --html over the history draws those too."
)


def finding_path(finding_id: str) -> str:
    return "/findings/" + quote(finding_id, safe="")


_TEMPLATES: Final = environment("detector.view")
_TEMPLATES.globals["finding_path"] = finding_path


def index(
    findings: Sequence[Finding],
    filters: Filters,
    *,
    total: int,
    caught_up: bool,
    failure: str | None,
) -> str:
    """The list (already filtered and ordered: open first), under the filters' form."""
    return _TEMPLATES.get_template("view/index.html").render(
        findings=findings,
        filters=filters,
        total=total,
        caught_up=caught_up,
        failure=failure,
        severities=[s.value for s in Severity],
        statuses=[s.value for s in Status],
        nav=False,
    )


def finding(revisions: Sequence[Finding], *, export: bool = False) -> str:
    """One finding (its latest revision), its timeline and its revisions, newest first. With
    `export`, a file of its own to attach to a ticket: no link back into the view."""
    f = revisions[-1]
    notes = [DRAWN_FROM]
    if f.evidence_truncated:
        notes.append("evidence truncated by a retention cap")
    return _TEMPLATES.get_template("view/finding.html").render(
        revisions=revisions, figure=draw(f, []).svg, notes=notes, export=export, nav=not export
    )


def not_found(finding_id: str) -> str:
    return _TEMPLATES.get_template("view/not_found.html").render(finding_id=finding_id, nav=True)


def login(next_path: str, *, refused: bool) -> str:
    """The token form: a browser gets a session cookie from it; scripts send the token as
    `Authorization: Bearer`."""
    return _TEMPLATES.get_template("view/login.html").render(
        next_path=next_path, refused=refused, nav=False
    )
