"""`splitbrain audit`: run the engine over a recorded history and report like a history checker."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final, NotRequired, TextIO

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from detector.cli.arguments import add_format, positive_int, positive_seconds
from detector.cli.main import silence_stdout
from detector.contracts.findings import Finding, Severity
from detector.core import Config
from detector.errors import ExitCode, InputError, SplitbrainError
from detector.histories.audit import AuditResult, StrictStopError, audit_lines
from detector.histories.reader import UnusableHistoryError, open_history
from detector.histories.window import EventWindows
from detector.report import count, finding_lines, printable
from detector.timeline import render

FAIL_ON_CHOICES: Final = ("info", "warning", "critical", "none")


def reaches(finding: Finding, fail_on: str) -> bool:
    return fail_on != "none" and finding.severity.rank >= Severity(fail_on).rank


# ---- the human report -------------------------------------------------------------------------

TRUNCATED_NOTE: Final = (
    "evidence beyond --max-evidence/--max-acquisitions was forgotten; findings of this "
    "workflow may be incomplete (raise the caps)"
)


def render_text(result: AuditResult, out: TextIO) -> None:
    def line(text: str = "") -> None:
        print(printable(text), file=out)

    findings = list(result.findings.values())
    by_sev = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    summary = ", ".join(f"{n} {s.value}" for s, n in by_sev.items() if n) or "none"
    counts = ", ".join(
        count(n, noun)
        for n, noun in (
            (result.events, "event"),
            (len(result.workflows), "workflow"),
            (len(findings), "finding"),
        )
    )
    line(
        f"splitbrain audit: {counts} ({summary}), {count(result.bad_count, 'line')} skipped, "
        f"{count(result.fields_dropped, 'field')} dropped, "
        f"{count(len(result.truncated), 'workflow')} truncated"
    )
    if result.times_disbelieved:
        n = result.times_disbelieved
        line(
            f"{n} observed_at {'time' if n == 1 else 'times'} beyond the clock-skew bound "
            f"{'was' if n == 1 else 'were'} not believed"
        )
    for text in finding_lines(findings):
        line(text)
    if result.truncated:
        line()
    for wf in result.truncated:
        line(f"truncated: {wf}: {TRUNCATED_NOTE}")
    # A workflow whose evidence was cut is not known to be clean.
    clean = sorted(result.workflows - {f.workflow_key for f in findings} - set(result.truncated))
    if clean:
        line()
        line(f"clean ({len(clean)}): {', '.join(clean[:20])}" + (" …" if len(clean) > 20 else ""))
    for w in result.lease_warnings:
        line(f"lease warning [{w.tool_class}] {w.reason}: {w.message}")


# ---- --expect ---------------------------------------------------------------------------------


class ExpectedCondition(TypedDict):
    kind: str
    seq: NotRequired[int | None]
    cause: NotRequired[str | None]


class ExpectedFinding(TypedDict):
    workflow_key: str
    displaced_epoch: NotRequired[int | None]
    current_epoch: NotRequired[int | None]
    severity: NotRequired[str]
    status: NotRequired[str]
    conditions: NotRequired[list[ExpectedCondition]]
    effect_keys: NotRequired[list[str]]


class Expectation(TypedDict):
    """The shape of an `--expect` file (DESIGN §6); unknown keys are ignored."""

    findings: NotRequired[list[ExpectedFinding]]
    clean: NotRequired[list[str]]


_EXPECTATION: Final = TypeAdapter(Expectation)


class ExpectationError(SplitbrainError, ValueError):
    """An `--expect` file that cannot be read or does not have the shape of an expectation."""


def load_expectation(path: str) -> Expectation:
    """Read and check an expectation file: a malformed one is an unusable input, never a FAIL
    (which would say the history is wrong) and never a traceback."""
    try:
        with open(path, "rb") as fh:
            return _EXPECTATION.validate_json(fh.read())
    except OSError as exc:
        raise ExpectationError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ExpectationError(
            f"{path} is not an expectation: {where + ': ' if where else ''}{first['msg']}"
        ) from None


def check_expectation(result: AuditResult, expected: Expectation) -> list[str]:
    """Differences between what the history produced and what the expectation file demands.

    Each listed finding must be met by a finding of its own (DESIGN §6): a finding of its
    workflow with that severity and status, those epochs and at least those conditions (kind,
    and seq and cause where given) and effect keys. A field the entry leaves out is not
    checked; an epoch given as `null` is (`"displaced_epoch": null` asks for a retry finding).
    Any finding of the workflow may meet an entry, and the entries are assigned to findings one
    to one by a maximum bipartite matching, so two identical entries need two findings and a
    loose entry listed first cannot take the only finding a stricter one accepts. An entry left
    unmet is reported with the differences of the closest finding of its workflow, or with the
    entries holding the findings that meet it.
    """
    findings = list(result.findings.values())
    wants = expected.get("findings", [])
    by_workflow: dict[str, list[int]] = {}
    for j, f in enumerate(findings):
        by_workflow.setdefault(f.workflow_key, []).append(j)
    meets = [
        [j for j in by_workflow.get(w["workflow_key"], []) if not _compare(findings[j], w)]
        for w in wants
    ]
    owner = _one_to_one(meets)
    taken = {j: i for i, j in enumerate(owner) if j is not None}
    problems: list[str] = []
    for i, want in enumerate(wants):
        if owner[i] is None:
            candidates = by_workflow.get(want["workflow_key"], [])
            problems.append(_unmet(i, want, findings, candidates, meets[i], taken))
    for wf in expected.get("clean", []):
        got = [f for f in findings if f.workflow_key == wf]
        if got:
            kinds = sorted({c.kind.value for f in got for c in f.conditions})
            problems.append(f"{wf}: expected clean, got {len(got)} finding(s): {', '.join(kinds)}")
    return problems


def _one_to_one(meets: list[list[int]]) -> list[int | None]:
    """A maximum matching of entries to the findings that meet them (augmenting paths, found
    breadth first, without recursion): for each entry, the index of its finding, or None when
    no assignment leaves it one."""
    finding_of: list[int | None] = [None] * len(meets)
    entry_of: dict[int, int] = {}
    for root in range(len(meets)):
        reached_from: dict[int, int] = {}  # a finding -> the entry the path reached it from
        queue, free = [root], None
        for i in queue:  # grows while it is read
            for j in meets[i]:
                if j in reached_from:
                    continue
                reached_from[j] = i
                if j not in entry_of:
                    free = j
                    break
                queue.append(entry_of[j])
            if free is not None:
                break
        while free is not None:  # flip the path: each entry on it takes the next finding
            i = reached_from[free]
            finding_of[i], entry_of[free], free = free, i, finding_of[i]
    return finding_of


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _epochs(want: ExpectedFinding) -> dict[str, int | None]:
    """The epochs an entry names (`null` included), by their names in the file."""
    named: dict[str, int | None] = {}
    if "displaced_epoch" in want:
        named["displaced_epoch"] = want["displaced_epoch"]
    if "current_epoch" in want:
        named["current_epoch"] = want["current_epoch"]
    return named


def _describe(want: ExpectedFinding) -> str:
    parts = [f"{name} {_json(epoch)}" for name, epoch in _epochs(want).items()]
    parts += [want[name] for name in ("severity", "status") if name in want]
    return f" ({', '.join(parts)})" if parts else ""


def _name(f: Finding) -> str:
    displaced = f.displaced.owner_epoch if f.displaced else None
    current = f.current.owner_epoch if f.current else None
    return (
        f"{f.finding_id} (displaced_epoch {_json(displaced)}, current_epoch {_json(current)}, "
        f"{f.severity.value}, {f.status.value})"
    )


def _unmet(
    i: int,
    want: ExpectedFinding,
    findings: list[Finding],
    candidates: list[int],
    meets: list[int],
    taken: dict[int, int],
) -> str:
    """Why listed finding `i` (numbered from 1, as in the file) has no finding of its own."""
    head = f"{want['workflow_key']}: expected finding {i + 1}{_describe(want)}"
    if meets:
        held = "; ".join(
            f"{findings[j].finding_id} by expected finding {taken[j] + 1}" for j in meets
        )
        return (
            f"{head}: each listed finding needs a finding of its own, and every finding that "
            f"meets this one is already matched ({held})"
        )
    if not candidates:
        return f"{head}: no finding for this workflow"
    closest = min(candidates, key=lambda j: (len(_compare(findings[j], want)), j in taken))
    of = f" of its {len(candidates)}" if len(candidates) > 1 else ""
    return (
        f"{head}: no finding matches; the closest{of}, {_name(findings[closest])}, differs: "
        + "; ".join(_compare(findings[closest], want))
    )


def _compare(f: Finding, want: ExpectedFinding) -> list[str]:
    """How `f` falls short of `want`: an empty list when it meets it."""
    problems = []
    for name, got in (("severity", f.severity.value), ("status", f.status.value)):
        expected = want.get(name)
        if expected is not None and expected != got:
            problems.append(f"{name} {got}, expected {expected}")
    actual = {"displaced_epoch": f.displaced, "current_epoch": f.current}
    for name, epoch in _epochs(want).items():
        owner = actual[name]
        got_epoch = owner.owner_epoch if owner else None
        if got_epoch != epoch:
            problems.append(f"{name} {_json(got_epoch)}, expected {_json(epoch)}")
    have = {(c.kind.value, c.seq, c.cause) for c in f.conditions}
    for c in want.get("conditions", []):
        key = (c["kind"], c.get("seq"), c.get("cause"))
        if not any(_cond_matches(key, h) for h in have):
            problems.append(f"missing condition {_json(dict(c))}")
    missing_keys = set(want.get("effect_keys", [])) - set(f.effect_keys)
    if missing_keys:
        problems.append(f"missing effect keys {_json(sorted(missing_keys))}")
    return problems


def _cond_matches(want: tuple[str, int | None, str | None], have: tuple[str, Any, Any]) -> bool:
    return all(w is None or w == h for w, h in zip(want, have, strict=True))


# ---- the command ------------------------------------------------------------------------------


def _unusable(message: str) -> InputError:
    """Exit 2 with the one line that names the input and its problem: escaped here, so that a
    newline in a file name or in a line's text cannot split it."""
    return InputError(printable(message))


def run(args: argparse.Namespace) -> int:
    """Exit status first, output second: a reader that goes away (`| head`) changes nothing."""
    try:
        expected = None if args.expect is None else load_expectation(args.expect)
    except ExpectationError as exc:
        raise _unusable(f"--expect: {exc}") from None
    caps = {
        name: getattr(args, name)
        for name in ("max_evidence", "max_acquisitions", "clock_skew_s", "quiet_period_s")
        if getattr(args, name) is not None
    }
    windows = None if args.html is None else EventWindows()
    try:
        with open_history(args.file) as lines:
            result = audit_lines(
                lines,
                strict=args.strict,
                on_bad=sys.stderr,
                config=Config.for_audit(**caps),
                windows=windows,
            )
    except UnusableHistoryError as exc:
        raise _unusable(f"cannot use {args.file}: {exc}") from None
    except OSError as exc:
        raise _unusable(f"cannot read {args.file}: {exc.strerror or exc}") from None
    except StrictStopError as exc:
        raise _unusable(f"{exc} (--strict)") from None
    if result.events == 0 and result.bad_count:
        raise _unusable(
            f"{args.file}: none of its {count(result.bad_count, 'line')} is a valid event "
            "(JSON or logfmt, one per line)"
        )
    if windows is not None:
        try:
            _write_html(args.html, args.file, result, windows)
        except OSError as exc:
            raise _unusable(f"--html: cannot write {args.html}: {exc.strerror or exc}") from None
    problems = None if expected is None else check_expectation(result, expected)
    if problems is not None:
        status = ExitCode.FAILED if problems else ExitCode.OK
    else:
        reached = any(reaches(f, args.fail_on) for f in result.findings.values())
        status = ExitCode.FAILED if reached else ExitCode.OK
    try:
        _write(result, args.format, problems)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
    return status


def _write_html(path: str, source: str, result: AuditResult, windows: EventWindows) -> None:
    page = render(
        result.findings.values(),
        windows,
        source="standard input" if source == "-" else source,
        events=result.events,
        workflows=len(result.workflows),
    )
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(page)


def _write(result: AuditResult, fmt: str, problems: list[str] | None) -> None:
    if fmt == "json":
        for f in result.findings.values():
            print(f.to_json())
        for wf in result.truncated:  # stdout holds findings only; this must still be seen
            print(
                printable(f"splitbrain audit: truncated: {wf}: {TRUNCATED_NOTE}"), file=sys.stderr
            )
    else:
        render_text(result, sys.stdout)
    if problems is not None:
        for p in problems:
            print(printable(f"  {p}"))
        print("FAIL" if problems else "PASS")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="check a recorded history (JSONL or logfmt) for split-brain",
        description="Run the detection rules over a history file and report findings. "
        "Exit 0: nothing reaches --fail-on; 1: something does (or --expect failed); "
        "2: the input cannot be used.",
    )
    p.add_argument("file", help="history file, one event per line; - for standard input")
    add_format(p, "text report (default) or the final revision of each finding as JSONL")
    p.add_argument(
        "--expect",
        metavar="EXPECTED.json",
        help="check the findings against an expectation file; prints PASS or FAIL",
    )
    p.add_argument(
        "--html",
        metavar="REPORT.html",
        help="also write a self-contained HTML report: each finding with the timeline of its "
        "workflow (no script, nothing fetched)",
    )
    p.add_argument(
        "--fail-on",
        choices=FAIL_ON_CHOICES,
        default="warning",
        help="lowest severity that makes the exit status 1 (default: warning)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop with exit 2 at the first line that is not a valid event",
    )
    defaults = Config.for_audit()
    caps = p.add_argument_group(
        "retention and time",
        "The defaults keep histories of thousands of events per workflow exact. A workflow "
        "whose evidence a cap cut is named in the report as truncated.",
    )
    caps.add_argument(
        "--max-evidence",
        type=positive_int,
        metavar="N",
        help="raw events kept per workflow for a late acquisition to look back at "
        f"(default: {defaults.max_evidence})",
    )
    caps.add_argument(
        "--max-acquisitions",
        type=positive_int,
        metavar="N",
        help=f"acquisitions kept per workflow (default: {defaults.max_acquisitions})",
    )
    caps.add_argument(
        "--clock-skew-s",
        type=positive_seconds,
        metavar="S",
        help="an observed_at further than S seconds beyond a workflow's latest believed time is "
        "not believed until another worker or source confirms it "
        f"(default: {defaults.clock_skew_s:g})",
    )
    caps.add_argument(
        "--quiet-period-s",
        type=positive_seconds,
        metavar="S",
        help="silence of a displaced owner, on the workflow's own times, that counts as fenced "
        f"(default: {defaults.quiet_period_s:g})",
    )
    p.set_defaults(run=run)
