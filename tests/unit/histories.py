"""Compact builders for event histories and helpers to read the findings they produce.

A history is a list of `OwnershipEvent`s in arrival order. `ev()` keeps each line readable:

    ev("e05", "lease_acquired", "wf", 18, "beta", seq=5)

`source` defaults to `coordinator` for acquisitions and `worker` otherwise; `t` is the emitter's
clock in seconds after a fixed base (it becomes `observed_at`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict, Unpack

from detector.contracts.events import OwnershipEvent, parse_event_json, parse_event_obj
from detector.contracts.findings import Finding
from detector.core import Config, Detector, FindingUpdate
from detector.histories.logfmt import parse_logfmt_line
from tests.paths import SEED_FIXTURE

BASE = datetime(2026, 7, 26, 10, 0, 0, tzinfo=UTC)
BASE_TS = BASE.timestamp()


class EventFields(TypedDict, total=False):
    """The optional event fields the builders pass on as they are, in their JSON form."""

    destination: str
    lease_until: str  # ISO 8601, with its offset
    lease_duration_s: float
    heartbeat_interval_s: float
    attrs: dict[str, str]
    detail: dict[str, Any]
    trace_id: str
    span_id: str
    job_queue_name: str


def ev(
    event_id: str,
    kind: str,
    wf: str,
    epoch: int,
    worker: str,
    *,
    seq: int | None = None,
    source: str | None = None,
    key: str | None = None,
    t: float | None = None,
    **extra: Unpack[EventFields],
) -> OwnershipEvent:
    """One event. `key` is the effect key; `t` seconds after BASE become `observed_at`."""
    return parse_event_obj(
        event_obj(event_id, kind, wf, epoch, worker, seq=seq, source=source, key=key, t=t, **extra)
    )


def event_obj(
    event_id: str,
    kind: str,
    wf: str,
    epoch: int,
    worker: str,
    *,
    seq: int | None = None,
    source: str | None = None,
    key: str | None = None,
    t: float | None = None,
    **extra: Unpack[EventFields],
) -> dict[str, Any]:
    """The JSON object of `ev`'s event, as an emitter writes it (for the worker's step and
    `audit`, which read bytes)."""
    obj: dict[str, Any] = {
        "event_id": event_id,
        "kind": kind,
        "workflow_key": wf,
        "owner_epoch": epoch,
        "worker_id": worker,
        "source": source or ("coordinator" if kind == "lease_acquired" else "worker"),
    }
    if seq is not None:
        obj["seq"] = seq
    if key is not None:
        obj["effect_key"] = key
    if t is not None:
        obj["observed_at"] = (BASE + timedelta(seconds=t)).isoformat()
    obj.update(extra)
    return obj


# The scenario vocabulary of tests/unit/scenarios: workflow `W`, whose effect key is `K`.
W = "export-ledger"
K = "release-index/2026-07-26"


def acq(
    event_id: str,
    epoch: int,
    worker: str,
    seq: int | None = None,
    wf: str = W,
    *,
    t: float | None = None,
    **kw: Unpack[EventFields],
) -> OwnershipEvent:
    return ev(event_id, "lease_acquired", wf, epoch, worker, seq=seq, t=t, **kw)


def takeover(wf: str = W, seq: bool = True) -> list[OwnershipEvent]:
    """alpha holds 17 (seq 1), beta acquires 18 (seq 5)."""
    return [
        acq("a17", 17, "alpha", 1 if seq else None, wf),
        acq("a18", 18, "beta", 5 if seq else None, wf),
    ]


def commit(
    event_id: str,
    epoch: int,
    worker: str,
    seq: int | None,
    key: str = K,
    source: str = "destination",
    wf: str = W,
    *,
    t: float | None = None,
    **kw: Unpack[EventFields],
) -> OwnershipEvent:
    return ev(
        event_id, "effect_committed", wf, epoch, worker, seq=seq, key=key, source=source, t=t, **kw
    )


def verify(event_id: str, seq: int, key: str = K, wf: str = W, epoch: int = 18) -> OwnershipEvent:
    return ev(
        event_id, "outcome_verified", wf, epoch, "checker", seq=seq, key=key, source="verifier"
    )


def seed_history() -> list[OwnershipEvent]:
    """The DESIGN §6 acceptance history (`tests.paths.SEED_FIXTURE`), in file order."""
    lines = SEED_FIXTURE.read_text().splitlines()
    return [parse_event_json(line) for line in lines if line.strip()]


def stale_commit() -> list[OwnershipEvent]:
    """The takeover, then alpha (displaced) commits `K` at seq 6."""
    return [*takeover(), commit("c", 17, "alpha", 6)]


def evidence_cap(n: int, **kw: Any) -> Config:
    """A Config retaining at most `n` raw events per workflow (`max_evidence`)."""
    return Config(max_evidence=n, **kw)


def generous(**kw: Any) -> Config:
    """A Config whose caps never bite in a test-sized history."""
    caps = {
        "max_evidence": 10_000,
        "max_acquisitions": 10_000,
        "max_effect_keys": 10_000,
        "max_event_ids": 10_000,
    }
    return Config(**{**caps, **kw})


def at(t: float) -> float:
    """The caller's "now" `t` seconds after BASE, for `observe(at=)` and `advance()`."""
    return BASE_TS + t


@dataclass
class Run:
    """A detector fed a history, with every update it published and every workflow `advance`
    said to persist."""

    detector: Detector
    updates: list[FindingUpdate] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)

    def feed(self, events: Iterable[OwnershipEvent], now: float | None = None) -> Run:
        for e in events:
            self.updates.extend(self.detector.observe(e, at=now))
        return self

    def advance(self, now: float) -> list[FindingUpdate]:
        advanced = self.detector.advance(now)
        self.updates.extend(advanced.updates)
        self.changed |= advanced.changed
        return advanced.updates

    def findings(self, wf: str | None = None) -> list[Finding]:
        return [f for f in self.detector.findings() if wf is None or f.workflow_key == wf]

    def finding(self, wf: str, displaced: int | None, *, retry_epoch: int | None = None) -> Finding:
        """The single finding of `wf` displacing `displaced` (or the retry finding of an epoch)."""
        hits = [
            f
            for f in self.findings(wf)
            if (f.displaced.owner_epoch if f.displaced else None) == displaced
            and (
                retry_epoch is None
                or any(c.cause == "retry" and c.epochs == [retry_epoch] for c in f.conditions)
            )
        ]
        assert len(hits) == 1, f"expected one finding for {wf}/{displaced}, got {hits}"
        return hits[0]

    def revisions(self, finding_id: str) -> list[Finding]:
        return [u.finding for u in self.updates if u.finding.finding_id == finding_id]


def run(
    events: Sequence[OwnershipEvent], config: Config | None = None, now: float | None = None
) -> Run:
    return Run(Detector(config=config or Config())).feed(events, now)


def conds(f: Finding) -> list[tuple[str, int | None, str | None]]:
    """(kind, seq, cause) of each condition, sorted by seq then kind."""
    out = [(c.kind.value, c.seq, c.cause) for c in f.conditions]
    return sorted(out, key=lambda c: (c[1] if c[1] is not None else -1, c[0]))


def cond_keys(f: Finding) -> set[tuple[str, str | None, str | None]]:
    """(kind, cause, effect_key) of each condition."""
    return {(c.kind.value, c.cause, c.effect_key) for c in f.conditions}


def epochs(f: Finding) -> tuple[int | None, int | None]:
    return (
        f.displaced.owner_epoch if f.displaced else None,
        f.current.owner_epoch if f.current else None,
    )


def logfmt_events(text: str) -> list[OwnershipEvent]:
    """Job-queue logfmt lines to events; a line without `event_id=` gets `line-N` (its number)."""
    out = []
    for n, line in enumerate(text.strip().splitlines(), start=1):
        if not line.strip():
            continue
        obj, dropped = parse_logfmt_line(line)
        obj.setdefault("event_id", f"line-{n}")
        out.append(parse_event_obj(obj, dropped))
    return out


def seed_renamed(path: Path, workflow_key: str) -> Path:
    """The acceptance history written to `path` with `export-ledger` renamed `workflow_key`."""
    events = [json.loads(line) for line in SEED_FIXTURE.read_text().splitlines()]
    for e in events:
        if e["workflow_key"] == "export-ledger":
            e["workflow_key"] = workflow_key
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path
