"""`splitbrain audit`: run the engine over a recorded history and report like a history checker."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

from detector.core import Config, Detector, LeaseWarning
from detector.findings import Finding, Severity
from detector.history import BadLine, open_history, read_history

EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_UNUSABLE: Final = 2
FAIL_ON_CHOICES: Final = ("info", "warning", "critical", "none")


@dataclass(slots=True)
class AuditResult:
    """Final revision of each finding, in the order findings opened, plus what was skipped."""

    findings: dict[str, Finding] = field(default_factory=dict)
    bad_lines: list[BadLine] = field(default_factory=list)
    events: int = 0
    workflows: set[str] = field(default_factory=set)
    lease_warnings: list[LeaseWarning] = field(default_factory=list)


class StrictStopError(Exception):
    def __init__(self, bad: BadLine) -> None:
        super().__init__(bad.describe())
        self.bad = bad


def audit_lines(
    lines: Iterable[bytes],
    *,
    strict: bool = False,
    on_bad: TextIO | None = None,
    config: Config | None = None,
) -> AuditResult:
    """Feed a history through a fresh engine; time is the history's own event-time watermark."""
    detector = Detector(config=config or Config())
    result = AuditResult()
    for item in read_history(lines):
        if isinstance(item, BadLine):
            if strict:
                raise StrictStopError(item)
            result.bad_lines.append(item)
            if on_bad is not None:
                print(f"skipped {item.describe()}", file=on_bad)
            continue
        result.events += 1
        result.workflows.add(item.event.workflow_key)
        for update in detector.observe(item.event):
            result.findings[update.finding.finding_id] = update.finding
    if detector.watermark is not None:
        for update in detector.advance(detector.watermark):
            result.findings[update.finding.finding_id] = update.finding
    result.lease_warnings = list(detector.lease_health.warnings)
    return result


def reaches(finding: Finding, fail_on: str) -> bool:
    return fail_on != "none" and finding.severity.rank >= Severity(fail_on).rank


# ---- the human report -------------------------------------------------------------------------

_VERB: Final = {
    "stale_activity": "was still active",
    "stale_effect_attempt": "attempted {k}",
    "stale_effect_committed": "had {k} committed",
    "stale_effect_rejected": "had {k} rejected",
}


def _at(seq: int | None, event_id: str) -> str:
    return f"at seq {seq} ({event_id})" if seq is not None else f"({event_id}, by arrival)"


def witness(f: Finding) -> str:
    """The minimal proof in plain words: the transition, then the stale events after it."""
    parts: list[str] = []
    stale = [c for c in f.conditions if c.kind.value.startswith("stale_")]
    dups = [c for c in f.conditions if c.kind.value == "duplicate_effect"]
    if f.displaced is not None and f.current is not None and f.transition is not None:
        opening = (
            f"{f.displaced.worker_id} lost epoch {f.displaced.owner_epoch} to a takeover "
            f"{_at(f.transition.seq, f.transition.event_id)} (now {f.current.worker_id}, "
            f"epoch {f.current.owner_epoch})"
        )
        if stale:
            acts = ", ".join(
                f"{_VERB[c.kind.value].format(k=c.effect_key)} {_at(c.seq, c.event_id)}"
                for c in stale
            )
            opening += f"; after that it {acts}"
        parts.append(opening + ".")
    for d in dups:
        epochs = " and ".join(str(e) for e in d.epochs or [])
        how = "under epochs" if d.cause == "failover" else "twice under epoch"
        parts.append(f"{d.effect_key} was committed {how} {epochs} {_at(d.seq, d.event_id)}.")
    return " ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def render_text(result: AuditResult, out: TextIO) -> None:
    findings = list(result.findings.values())
    by_sev = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    summary = ", ".join(f"{n} {s.value}" for s, n in by_sev.items() if n) or "none"
    counts = ", ".join(
        _count(n, noun)
        for n, noun in (
            (result.events, "event"),
            (len(result.workflows), "workflow"),
            (len(findings), "finding"),
        )
    )
    skipped = _count(len(result.bad_lines), "line")
    print(f"splitbrain audit: {counts} ({summary}), {skipped} skipped", file=out)
    for f in sorted(findings, key=lambda f: (-f.severity.rank, f.workflow_key)):
        displaced = (
            f"epoch {f.displaced.owner_epoch} ({f.displaced.worker_id}) still acting"
            if f.displaced
            else "one owner committed twice"
        )
        print(file=out)
        print(f"{f.severity.value.upper():8} {f.workflow_key}: {displaced}", file=out)
        print(
            f"  {f.finding_id} rev {f.revision}, {f.status.value}, confidence {f.confidence}, "
            f"ordering {f.ordering}, sink {f.sink_outcome}",
            file=out,
        )
        print(f"  witness: {witness(f)}", file=out)
        for c in f.conditions:
            extra = f" {c.effect_key}" if c.effect_key else ""
            extra += f" cause={c.cause}" if c.cause else ""
            seq = "-" if c.seq is None else str(c.seq)
            print(f"    seq {seq:>6}  {c.event_id:<12} {c.kind.value}{extra}", file=out)
        print(f"  response: {f.response}", file=out)
    clean = sorted(result.workflows - {f.workflow_key for f in findings})
    if clean:
        print(
            f"\nclean ({len(clean)}): {', '.join(clean[:20])}" + (" …" if len(clean) > 20 else ""),
            file=out,
        )
    for w in result.lease_warnings:
        print(f"lease warning [{w.tool_class}] {w.reason}: {w.message}", file=out)


# ---- --expect ---------------------------------------------------------------------------------


def check_expectation(result: AuditResult, expected: dict[str, Any]) -> list[str]:
    """Differences between what the history produced and what the expectation file demands."""
    problems: list[str] = []
    findings = list(result.findings.values())
    for want in expected.get("findings", []):
        wf = want["workflow_key"]
        epoch = want.get("displaced_epoch")
        candidates = [
            f
            for f in findings
            if f.workflow_key == wf and (f.displaced.owner_epoch if f.displaced else None) == epoch
        ]
        if not candidates:
            problems.append(f"{wf}: no finding with displaced epoch {epoch}")
            continue
        problems.extend(f"{wf}: {p}" for p in _compare(candidates[0], want))
    for wf in expected.get("clean", []):
        got = [f for f in findings if f.workflow_key == wf]
        if got:
            kinds = sorted({c.kind.value for f in got for c in f.conditions})
            problems.append(f"{wf}: expected clean, got {len(got)} finding(s): {', '.join(kinds)}")
    return problems


def _compare(f: Finding, want: dict[str, Any]) -> list[str]:
    problems = []
    for name, got in (("severity", f.severity.value), ("status", f.status.value)):
        if name in want and want[name] != got:
            problems.append(f"{name} {got}, expected {want[name]}")
    current = f.current.owner_epoch if f.current else None
    if "current_epoch" in want and want["current_epoch"] != current:
        problems.append(f"current epoch {current}, expected {want['current_epoch']}")
    have = {(c.kind.value, c.seq, c.cause) for c in f.conditions}
    for c in want.get("conditions", []):
        key = (c["kind"], c.get("seq"), c.get("cause"))
        if not any(_cond_matches(key, h) for h in have):
            problems.append(f"missing condition {c}")
    missing_keys = set(want.get("effect_keys", [])) - set(f.effect_keys)
    if missing_keys:
        problems.append(f"missing effect keys {sorted(missing_keys)}")
    return problems


def _cond_matches(want: tuple[str, int | None, str | None], have: tuple[str, Any, Any]) -> bool:
    return all(w is None or w == h for w, h in zip(want, have, strict=True))


# ---- the command ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        with open_history(args.file) as fh:
            result = audit_lines(fh, strict=args.strict, on_bad=sys.stderr)
    except OSError as exc:
        print(f"splitbrain audit: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except StrictStopError as exc:
        print(f"splitbrain audit: {exc} (--strict)", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.format == "json":
        for f in result.findings.values():
            print(f.to_json())
    else:
        render_text(result, sys.stdout)
    if args.expect is not None:
        return _run_expect(result, args.expect)
    return (
        EXIT_FINDINGS
        if any(reaches(f, args.fail_on) for f in result.findings.values())
        else EXIT_OK
    )


def _run_expect(result: AuditResult, path: str) -> int:
    try:
        with open(path, encoding="utf-8") as fh:
            expected = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"splitbrain audit: cannot use --expect {path}: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    problems = check_expectation(result, expected)
    for p in problems:
        print(f"  {p}")
    print("FAIL" if problems else "PASS")
    return EXIT_FINDINGS if problems else EXIT_OK


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "audit",
        help="check a recorded history (JSONL or logfmt) for split-brain",
        description="Run the detection rules over a history file and report findings. "
        "Exit 0: nothing reaches --fail-on; 1: something does (or --expect failed); "
        "2: the input cannot be used.",
    )
    p.add_argument("file", help="history file, one event per line; - for standard input")
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text report (default) or the final revision of each finding as JSONL",
    )
    p.add_argument(
        "--expect",
        metavar="EXPECTED.json",
        help="check the findings against an expectation file; prints PASS or FAIL",
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
    p.set_defaults(run=run)
