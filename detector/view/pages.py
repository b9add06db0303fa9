"""The view's pages, rendered on the server: findings in, HTML out (no I/O, no framework).

Every value from the topic goes through `text` (escaped, controls made visible), every link to
a finding percent-encodes its id, and the pages carry no script at all: the policy in `CSP`
allows only the one stylesheet whose hash it names, so markup that escaped its escaping still
could not run or load anything. A page shows what a finding holds (ids, keys, hashes), nothing
more: the view never reads events or payloads.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Final
from urllib.parse import quote, urlencode

from detector.contracts.findings import Finding, Severity, Status
from detector.report import count, witness
from detector.timeline.page import LEGEND, STYLE, context_html
from detector.timeline.svg import draw, text
from detector.version import package_version
from detector.view.store import Filters

VIEW_STYLE: Final = (
    STYLE
    + """
nav{margin-bottom:12px}form.filters{margin:12px 0}form.filters label{margin-right:12px}
td.id,span.id{font-family:ui-monospace,monospace;font-size:12px}
tr.status-resolved{color:#4b5563}
.banner{background:#fef3c7;border:1px solid #f59e0b;padding:6px 10px}
"""
)
_STYLE_HASH: Final = base64.b64encode(hashlib.sha256(VIEW_STYLE.encode()).digest()).decode()
# No script anywhere; the one stylesheet by its hash; forms only back to the view.
CSP: Final = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
DRAWN_FROM: Final = (
    "Drawn from the finding alone: both owners' lanes, the takeover and the event of each "
    "condition, placed by seq (by the finding's order where an event has none). What the "
    "finding does not hold is not drawn: the owners' other events, the fences, releases and "
    "verifications. splitbrain audit --html over the history draws those too."
)


def finding_path(finding_id: str) -> str:
    return "/findings/" + quote(finding_id, safe="")


def _page(title: str, body: str, *, nav: bool = True) -> str:
    links = '<nav><a href="/">all findings</a></nav>' if nav else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{text(title)}</title><style>{VIEW_STYLE}</style></head><body>{links}"
        f'{body}<p class="note">splitbrain {text(package_version())}</p></body></html>\n'
    )


def _conditions(f: Finding) -> str:
    out = ", ".join(f"{c.kind.value}@{'-' if c.seq is None else c.seq}" for c in f.conditions)
    return out + (f" (+{f.conditions_omitted})" if f.conditions_omitted else "")


def _select(name: str, values: Sequence[str], chosen: str | None) -> str:
    options = [f'<option value=""{"" if chosen else " selected"}>any</option>']
    for v in values:
        selected = " selected" if v == chosen else ""
        options.append(f'<option value="{v}"{selected}>{v}</option>')
    return f'<label>{name} <select name="{name}">{"".join(options)}</select></label>'


def index(
    findings: Sequence[Finding],
    filters: Filters,
    *,
    total: int,
    caught_up: bool,
    failure: str | None,
) -> str:
    """The list (already filtered and ordered: open first), under the filters' form."""
    form = (
        '<form class="filters" method="get" action="/">'
        + _select("severity", [s.value for s in Severity], filters.severity)
        + _select("status", [s.value for s in Status], filters.status)
        + '<label>workflow <input type="text" name="workflow" value="'
        + text(filters.workflow or "")
        + '"></label><button type="submit">filter</button></form>'
    )
    banners = []
    if not caught_up:
        banners.append("Still reading the findings topic: the list is not complete yet.")
    if failure is not None:
        banners.append(f"Reading the findings topic stopped ({text(failure)}): shown as read.")
    rows = []
    for f in findings:
        rows.append(
            f'<tr class="finding-row status-{f.status.value}" data-severity="{f.severity.value}" '
            f'data-status="{f.status.value}" data-finding-id="{text(f.finding_id)}">'
            f'<td class="sev-{f.severity.value}">{f.severity.value}</td><td>{f.status.value}</td>'
            f'<td class="workflow"><a href="{text(finding_path(f.finding_id))}">'
            f"{text(f.workflow_key)}</a></td><td>{text(_conditions(f))}</td>"
            f"<td>{f.confidence}</td><td>{f.revision}</td>"
            f'<td class="id">{text(f.finding_id)}</td></tr>'
        )
    head = (
        "<tr><th>severity</th><th>status</th><th>workflow</th><th>conditions</th>"
        "<th>confidence</th><th>revision</th><th>finding</th></tr>"
    )
    table = (
        f'<table class="findings">{head}{"".join(rows)}</table>'
        if rows
        else '<p class="empty">No finding matches.</p>'
    )
    shown = f"{len(findings)} of {count(total, 'finding')} shown, open first"
    body = (
        "<h1>splitbrain findings</h1>"
        + "".join(f'<p class="banner">{b}</p>' for b in banners)
        + form
        + f'<p class="note">{shown}</p>{table}'
    )
    return _page("splitbrain findings", body, nav=False)


def _revisions(revisions: Sequence[Finding]) -> str:
    rows = []
    for f in reversed(revisions):
        stale = f.last_stale_event
        lag = f.evidence_lag
        rows.append(
            f'<tr class="revision" data-revision="{f.revision}"><td>{f.revision}</td>'
            f'<td>{f.status.value}</td><td class="sev-{f.severity.value}">{f.severity.value}</td>'
            f"<td>{f.confidence} ({f.ordering})</td><td>{text(_conditions(f))}</td>"
            f"<td>{'' if stale is None else text(f'{stale.kind} {stale.event_id}')}</td>"
            f"<td>{'' if lag is None or lag.seq is None else lag.seq}</td>"
            f"<td>{f.sink_outcome}</td></tr>"
        )
    head = (
        "<tr><th>revision</th><th>status</th><th>severity</th><th>confidence</th>"
        "<th>conditions</th><th>last stale event</th><th>evidence lag (seq)</th>"
        "<th>sink outcome</th></tr>"
    )
    return f'<table class="revisions">{head}{"".join(rows)}</table>'


def finding(revisions: Sequence[Finding], *, export: bool = False) -> str:
    """One finding (its latest revision), its timeline and its revisions, newest first. With
    `export`, a file of its own to attach to a ticket: no link back into the view."""
    f = revisions[-1]
    displaced = (
        f"epoch {f.displaced.owner_epoch} ({text(f.displaced.worker_id)}) still acting"
        if f.displaced
        else "one owner committed twice"
    )
    links = ""
    if not export:
        links = (
            f'<p><a class="export" href="{text(finding_path(f.finding_id))}.html" download>'
            "download this finding as one HTML file</a> (self-contained, for a ticket)</p>"
        )
    notes = [DRAWN_FROM]
    if f.evidence_truncated:
        notes.append("evidence truncated by a retention cap")
    keys = ", ".join(f.effect_keys) + (
        f" (+{f.effect_keys_omitted})" if f.effect_keys_omitted else ""
    )
    traces = "".join(f"<li>{text(link)}</li>" for link in f.trace_links)
    body = (
        f'<section class="finding" data-finding-id="{text(f.finding_id)}">'
        f'<h1><span class="sev-{f.severity.value}">{f.severity.value.upper()}</span> '
        f'<span class="workflow">{text(f.workflow_key)}</span>: {displaced}</h1>'
        f'<p class="note"><span class="id">{text(f.finding_id)}</span> rev {f.revision}, '
        f'<span class="status">{f.status.value}</span>, confidence {f.confidence}, '
        f"ordering {f.ordering}, sink {f.sink_outcome}</p>{links}"
        f'<div class="figure">{draw(f, []).svg}</div>'
        + "".join(f'<p class="note">{n}</p>' for n in notes)
        + f'<p class="note">{LEGEND}</p>'
        f'<h2>Witness</h2><p class="witness">{text(witness(f))}</p>'
        + context_html(f, "h2")
        + f'<h2>Response</h2><p class="response">{text(f.response)}</p>'
        f"<h2>Effect keys</h2><p>{text(keys) or 'none'}</p>"
        + (f"<h2>Traces</h2><ul>{traces}</ul>" if traces else "")
        + f"<h2>Revisions</h2>{_revisions(revisions)}</section>"
    )
    return _page(f"splitbrain finding {f.workflow_key}", body, nav=not export)


def not_found(finding_id: str) -> str:
    body = (
        f'<h1>No such finding</h1><p>The findings topic holds no finding <span class="id">'
        f"{text(finding_id)}</span> (yet, or any more: the topic's retention drops old ones).</p>"
    )
    return _page("splitbrain: no such finding", body)


def login(next_path: str, *, refused: bool) -> str:
    """The token form: a browser gets a session cookie from it; scripts send the token as
    `Authorization: Bearer`."""
    wrong = '<p class="banner">That token is not the one this view was started with.</p>'
    body = (
        "<h1>splitbrain findings: token needed</h1>"
        + (wrong if refused else "")
        + '<form method="post" action="/login?'
        + text(urlencode({"next": next_path}))
        + '"><label>token <input type="password" name="token" autocomplete="off"></label>'
        '<button type="submit">open</button></form>'
    )
    return _page("splitbrain: token needed", body, nav=False)
