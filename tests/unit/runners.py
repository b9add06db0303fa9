"""One history through the product's own paths, and what a reader of its output may rely on.

- `audit`: the engine as `splitbrain audit` drives it (`observe` without a caller time, then
  `finish`), returning every revision;
- `audit_lines`-through-bytes is the product's `detector.histories.audit.audit_lines` itself;
- `Worker`: the per-record step both worker runtimes share (`PartitionProcessor` over a
  `MemoryStore`), fed the records' bytes at the worker's own times;
- `Published`: a reader of `splitbrain.findings.v1` (DESIGN §5), checking each revision as it
  comes: revisions 1, 2, 3 … per `finding_id` (so no pair twice), each under 64 KiB encoded,
  and the engine's own `findings()` equal to the latest revision published.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hypothesis import settings
from prometheus_client import CollectorRegistry

from detector.contracts.events import OwnershipEvent
from detector.contracts.findings import Finding
from detector.core import Config, Detector, FindingUpdate
from detector.runtime.processor import PartitionProcessor
from detector.runtime.store import MemoryStore
from detector.telemetry.metrics import WorkerMetrics
from tests.unit.histories import BASE_TS

MAX_REVISION_BYTES: Final = 64 * 1024  # DESIGN §4 Retention: every revision stays under it
TOPIC: Final = "agent.ownership.v1"


def share_of_budget(divisor: int) -> settings:
    """Settings for a test that costs more per example: a share of the active hypothesis
    profile's budget (tests/conftest.py), at least 4 examples."""
    profile = settings.default
    assert profile is not None  # tests/conftest.py loads one
    return settings(max_examples=max(4, profile.max_examples // divisor))


def audit_config() -> Config:
    """`audit`'s caps: histories of thousands of events per workflow stay exact."""
    return Config.for_audit()


def audit(
    events: Sequence[OwnershipEvent], config: Config | None = None
) -> tuple[Detector, list[FindingUpdate]]:
    """Feed a whole history as `audit` does (no caller time), then end it."""
    d = Detector(config=config or audit_config())
    updates: list[FindingUpdate] = []
    for e in events:
        updates.extend(d.observe(e))
    updates.extend(d.finish())
    return d, updates


def final(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """Final documents, comparable across runs: `revision` counts the changes on the way, so it
    depends on arrival; every other field is the verdict."""
    return sorted(
        (f.model_dump(mode="json", exclude={"revision"}) for f in findings),
        key=lambda f: f["finding_id"],
    )


def changed_fields(a: Finding, b: Finding) -> dict[str, tuple[Any, Any]]:
    """The fields of two revisions that differ, for a readable assertion message."""
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    return {
        k: (da.get(k), db.get(k)) for k in sorted(da.keys() | db.keys()) if da.get(k) != db.get(k)
    }


@dataclass(slots=True)
class Published:
    """The latest revision of each finding, as a reader of the findings topic keeps it."""

    latest: dict[str, Finding] = field(default_factory=dict)

    def take(self, updates: Iterable[FindingUpdate]) -> None:
        for u in updates:
            f = u.finding
            prev = self.latest.get(f.finding_id)
            expected = 1 if prev is None else prev.revision + 1
            assert f.revision == expected, (
                f"{f.finding_id}: revision {f.revision} published after "
                f"{None if prev is None else prev.revision}"
            )
            size = len(f.to_json().encode())
            assert size < MAX_REVISION_BYTES, f"{f.finding_id} rev {f.revision}: {size} bytes"
            self.latest[f.finding_id] = f

    def agree(self, d: Detector, when: str = "") -> None:
        """The engine holds nothing a reader was not told: each finding it holds is the latest
        revision published, field for field."""
        held = {f.finding_id: f for f in d.findings()}
        assert sorted(held) == sorted(self.latest), f"{when}: held {sorted(held)}"
        for fid, f in held.items():
            assert f == self.latest[fid], (
                f"{when}: {fid} changed without a new revision (held, published): "
                f"{changed_fields(f, self.latest[fid])}"
            )


def processor(config: Config) -> PartitionProcessor:
    """A worker's step for one partition, its states in memory as the worker's default store."""
    detector = Detector(config=config, states=MemoryStore().states)
    return PartitionProcessor(0, detector, WorkerMetrics(CollectorRegistry()))


def records(events: Sequence[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    """(key, value) records of JSON event objects, as an emitter publishes them."""
    return [(e["workflow_key"].encode(), json.dumps(e).encode()) for e in events]


def worker(
    recs: Sequence[tuple[bytes, bytes]],
    config: Config,
    *,
    spacing: float = 0.0,
    ticks: Container[int] = (),
) -> tuple[PartitionProcessor, Published]:
    """Records through a worker's step, record i at `BASE_TS + spacing * i` on the worker's
    clock; after each record numbered in `ticks`, time passes (the runtime's tick, `spacing / 2`
    later). Every revision goes through `Published`, and the engine's findings are compared with
    what was published after each tick and at the end. With the default spacing the worker's
    clock stands still: no silence is measured, as in `audit` without `observed_at` times."""
    p = processor(config)
    published = Published()
    for i, (key, value) in enumerate(recs):
        now = BASE_TS + spacing * i
        outcome = p.process(key, value, TOPIC, i, now)
        assert outcome.dead_letter is None, outcome.dead_letter
        published.take(outcome.findings)
        if i in ticks:
            ticked = p.tick(now + spacing / 2)
            if ticked is not None:
                published.take(ticked.findings)
                published.agree(p.detector, f"after the tick following record {i}")
    published.agree(p.detector, "at the end")
    return p, published
