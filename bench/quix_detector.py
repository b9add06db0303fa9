"""The detector as a quixstreams application: the yardstick of `bench_side_by_side.py`.

The same job as `splitbrain worker`, written the way quixstreams invites it: exactly-once, each
workflow's state in quixstreams' own RocksDB state (keyed by the message key, the workflow; the
bytes of `encode_state`, so its changelog carries what the worker's does), the same intake
(`admit`) and the same `Detector` per message, each finding revision (`finding.to_json()`) to
its own findings topic, keyed by workflow. Dead letters are dropped (the benchmark's history has
none). It lets no time pass (`Detector.advance`): that publishes only after a quiet period (600
s by default), longer than a benchmark run.

It needs quixstreams, whose pins exclude this project's (confluent-kafka and pydantic), so it
runs in a venv of its own, with bench/requirements-quix.txt: `bench_side_by_side.py` builds it
and starts this script with its python. Stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Final

from quixstreams import (  # type: ignore[import-not-found]  # its own venv
    Application,
    State,
    message_context,
)

from detector import gc_tuning
from detector.contracts.dead_letters import DeadLetter
from detector.core import Config, Detector, decode_state, encode_state
from detector.runtime.intake import admit
from detector.telemetry.trace_context import Headers

STATE_KEY: Final = "state"  # the one value of each workflow (the message key is the prefix)


class Step:
    """One record: restore its workflow's state into the engine, observe, store the state back.

    The engine holds one workflow at a time: quixstreams' state, not the engine's dict, is where
    the states live between records, as in any quixstreams application.
    """

    def __init__(self) -> None:
        self.detector = Detector(Config())

    def __call__(
        self, value: bytes, key: bytes, timestamp: int, headers: Headers, state: State
    ) -> list[bytes]:
        ctx = message_context()
        event = admit(key, value, ctx.topic, ctx.partition, ctx.offset, headers)
        if isinstance(event, DeadLetter):
            return []
        wf = event.workflow_key
        states = self.detector.states
        states.clear()
        raw = state.get_bytes(STATE_KEY)  # as stored: no JSON
        if raw is not None:
            states[wf] = decode_state(raw)
        updates = self.detector.observe(event, at=time.time())
        kept = states.get(wf)
        if kept is None:
            state.delete(STATE_KEY)
        else:
            state.set_bytes(STATE_KEY, encode_state(kept))
        return [update.finding.to_json().encode() for update in updates]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--input-topic", required=True)
    ap.add_argument("--findings-topic", required=True)
    ap.add_argument("--group-id", required=True)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--commit-interval-ms", type=int, default=100)
    ap.add_argument("--commit-max-events", type=int, default=5000)
    args = ap.parse_args()
    gc_tuning.tune()  # as the splitbrain CLI does
    app = Application(
        broker_address=args.bootstrap_servers,
        consumer_group=args.group_id,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=args.commit_interval_ms / 1000,
        commit_every=args.commit_max_events,
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    events = app.topic(args.input_topic, key_deserializer="bytes", value_deserializer="bytes")
    findings = app.topic(args.findings_topic, key_serializer="bytes", value_serializer="bytes")
    sdf = app.dataframe(events)
    sdf = sdf.apply(Step(), stateful=True, metadata=True, expand=True)
    sdf.to_topic(findings)
    app.run()


if __name__ == "__main__":
    main()
