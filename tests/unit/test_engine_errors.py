"""An exception of the engine costs one event, never its partition: the engine's mark
(`Detector.failed`) and what the shared processing step asks a runtime to write."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from detector.contracts.events import parse_event_json
from detector.core import Detector, WorkflowState, decode_state, encode_state
from detector.runtime.engine_errors import EngineError
from detector.runtime.processor import PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics
from detector.testing.faulty_worker import FAULT_EVENT_ID, FaultyDetector
from detector.version import package_version
from tests.paths import SEED_FIXTURE

TOPIC = "agent.ownership.v1"
LEDGER = "export-ledger"


def fixture() -> list[bytes]:
    return [line for line in SEED_FIXTURE.read_bytes().splitlines() if line.strip()]


def test_a_marked_workflow_says_its_later_findings_may_be_incomplete() -> None:
    events = [parse_event_json(line) for line in fixture()]
    plain = Detector()
    unmarked = [u.finding for e in events for u in plain.observe(e)]
    assert not any(f.evidence_truncated for f in unmarked)
    assert unmarked[-1].confidence == "high"
    detector = Detector()
    before = [u.finding for e in events[:7] for u in detector.observe(e)]  # up to the attempt
    assert before == unmarked[: len(before)]

    detector.failed(LEDGER)
    assert detector.truncated_workflows() == [LEDGER]
    after = [u.finding for e in events[7:] for u in detector.observe(e)]
    ledger = [f for f in after if f.workflow_key == LEDGER]
    # Later revisions go on from the last published one, each saying what it knows may be
    # incomplete, and so never of high confidence.
    assert [f.revision for f in ledger] == [before[-1].revision + 1, before[-1].revision + 2]
    assert all(f.evidence_truncated and f.confidence != "high" for f in ledger)
    assert [f.workflow_key for f in after if f.workflow_key != LEDGER] == []


def test_a_workflow_marked_before_its_first_event_is_marked_when_it_comes() -> None:
    detector = Detector()
    detector.failed(LEDGER)
    updates = [u for line in fixture() for u in detector.observe(parse_event_json(line))]
    assert updates and all(u.finding.evidence_truncated for u in updates)


def test_the_mark_is_kept_in_the_persisted_state() -> None:
    state = WorkflowState()
    Detector(states={LEDGER: state}).failed(LEDGER)
    restored = decode_state(encode_state(state))
    detector = Detector(states={LEDGER: restored})
    updates = [u for line in fixture() for u in detector.observe(parse_event_json(line))]
    assert updates and all(u.finding.evidence_truncated for u in updates)


def test_the_step_dead_letters_the_event_marks_its_workflow_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = PartitionProcessor(2, FaultyDetector(), WorkerMetrics(CollectorRegistry()))
    lines = fixture()
    fault = lines[5].replace(b'"e06"', f'"{FAULT_EVENT_ID}"'.encode())  # a stale progress
    with caplog.at_level(logging.INFO, logger="detector.runtime.processor"):
        failed = p.process(LEDGER.encode(), fault, TOPIC, 41, now=1.0)
    dead = failed.dead_letter
    assert dead is not None and (dead.key, dead.value) == (LEDGER.encode(), fault)
    headers = {name: value for name, value in dead.headers() if isinstance(value, bytes)}
    assert len(headers) == len(dead.headers())
    digest = headers["error.traceback_hash"]
    assert re.fullmatch(rb"[0-9a-f]{16}", digest), headers
    version = package_version().encode()
    assert headers["error.reason"] == (
        b"engine_error: InjectedFaultError (traceback %s, splitbrain-detector %s)"
        % (digest, version)
    )
    assert headers["error.class"] == b"InjectedFaultError"
    assert headers["detector.version"] == version
    assert (headers["source.partition"], headers["source.offset"]) == (b"2", b"41")
    # Nothing published; the marked state is persisted with the event's offset.
    assert (failed.findings, failed.changed) == ([], {LEDGER})

    def errors() -> float:
        return p.metrics.registry.get_sample_value("splitbrain_engine_errors_total") or 0.0

    assert errors() == 0  # counted when the transaction that dead-letters it commits
    p.metrics.committed(0.01, 1)
    assert errors() == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "InjectedFaultError" in line and digest.decode() in line
    assert "workflow#" in line and LEDGER not in line  # nor the message, which names it

    outcomes = [p.process(k, v, TOPIC, i, now=2.0) for i, (k, v) in enumerate(keyed(lines))]
    assert all(o.dead_letter is None for o in outcomes)
    ledger = [u.finding for o in outcomes for u in o.findings]
    assert [f.revision for f in ledger] == [1, 2, 3, 4]
    assert all(f.workflow_key == LEDGER and f.evidence_truncated for f in ledger)


def test_one_bug_hashes_the_same_whatever_the_event_and_another_one_not() -> None:
    def raised(text: str, twice: bool = False) -> EngineError:
        try:
            if twice:
                raise KeyError(text)
            raise KeyError(text)
        except KeyError as exc:
            return EngineError.of(exc)

    one, same, elsewhere = raised("tenant-1"), raised("tenant-2"), raised("tenant-1", True)
    assert one.traceback_hash == same.traceback_hash != elsewhere.traceback_hash
    assert one.error_class == "KeyError"
    assert "test_engine_errors.py" in one.stack and "tenant" not in one.stack


def keyed(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    return [(parse_event_json(line).workflow_key.encode(), line) for line in lines]


class _RaisesOnTime(Detector):
    """An engine whose time step raises for one workflow: the bug of a quiet-period check."""

    def _advance_one(self, key: str, *args: Any) -> None:
        if key == LEDGER:
            raise KeyError(key)
        super()._advance_one(key, *args)


def test_an_exception_letting_time_pass_costs_its_workflow_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`tick` is no event, but one workflow's exception there must not stop the partition (at
    every tick, and at every restart from the same state): the others' time goes on."""
    p = PartitionProcessor(0, _RaisesOnTime(), WorkerMetrics(CollectorRegistry()))
    other = [line.replace(LEDGER.encode(), b"other") for line in fixture()]
    for i, (k, v) in enumerate([*keyed(fixture()), *keyed(other)]):
        p.process(k, v, TOPIC, i, now=1.0)
    with caplog.at_level(logging.ERROR, logger="detector.runtime.processor"):
        ticked = p.tick(1.0 + 8 * 24 * 3600.0)  # past every quiet period and the idle TTL
    assert ticked is not None and {LEDGER, "other"} <= ticked.changed  # its time went on
    (line,) = [r.getMessage() for r in caplog.records]
    assert "KeyError" in line and LEDGER not in line
    p.metrics.committed(0.01, 1)
    assert p.metrics.registry.get_sample_value("splitbrain_engine_errors_total") == 1
    assert LEDGER in p.detector.truncated_workflows()
    # Without a worker's handler (`audit`, tests) the exception goes up.
    with pytest.raises(KeyError):
        p.detector.advance(1.0 + 16 * 24 * 3600.0)
