"""The changelog's size at each zstd level, offline: which level the worker creates it with.

Why: the broker recompresses the changelog with the topic's codec and level, and what it stores
per input byte moves with the transactions' size (so with the load) when measured on a broker.
Here the fleet history (bench_fleet_worker, either `--shape`) goes through one
`PartitionProcessor` per partition; every `--per-transaction` events, each partition's states
changed since the last transaction are encoded and compressed together, as the broker compresses
a batch. Prints what the processing step and the encoding of the changed states each cost per
event (no Kafka: where a worker's time goes as its workflows grow old), bytes per input (JSON)
byte and compression time per raw byte at each level; asserts nothing.
Run: `python bench/bench_changelog_level.py [--shape short|long] [--events N]
[--per-transaction N]`.
"""

from __future__ import annotations

import argparse
import time
import zlib
from dataclasses import dataclass, field

import zstandard
from bench_worker import workflow_key
from fleet_history import SHAPES, ZOMBIE_EVERY, fleet

from detector import gc_tuning
from detector.core import Detector, encode_state
from detector.runtime.processor import PartitionProcessor
from detector.telemetry.metrics import WorkerMetrics

LEVELS = (1, 3, 6, 9, 12, 15, 19)
BATCH_OVERHEAD = 61  # a record batch's header, bytes
Batch = list[tuple[bytes, bytes]]


@dataclass
class Batches:
    """Each transaction's changelog records, one batch per partition it touched, and the
    seconds spent in the processing step and in encoding the changed states."""

    batches: list[Batch] = field(default_factory=list)
    step_s: float = 0.0
    encode_s: float = 0.0


def batches(lines: list[bytes], partitions: int, per_transaction: int) -> Batches:
    metrics = WorkerMetrics()
    processors = [PartitionProcessor(p, Detector(), metrics) for p in range(partitions)]
    changed: list[set[str]] = [set() for _ in range(partitions)]
    out = Batches()
    started = time.time()
    for offset, raw in enumerate(lines):
        key = workflow_key(raw)
        p = zlib.crc32(key) % partitions
        at = time.perf_counter()
        changed[p] |= processors[p].process(key, raw, "in", offset, started + offset / 1000).changed
        out.step_s += time.perf_counter() - at
        if (offset + 1) % per_transaction and offset + 1 < len(lines):
            continue
        at = time.perf_counter()
        for p, keys in enumerate(changed):
            states = processors[p].detector.states
            records = [
                (k.encode(), encode_state(st) if (st := states.get(k)) else b"") for k in keys
            ]
            if records:
                out.batches.append(records)
            keys.clear()
        out.encode_s += time.perf_counter() - at
    return out


def framed(batch: Batch) -> bytes:
    return b"".join(len(k).to_bytes(2, "big") + k + len(v).to_bytes(4, "big") + v for k, v in batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", choices=SHAPES, default="short", help="bench_fleet_worker's")
    ap.add_argument("--events", type=int, default=120_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--per-transaction", type=int, default=600)
    ap.add_argument("--levels", type=int, nargs="*", default=LEVELS, help="zstd levels to try")
    args = ap.parse_args()
    gc_tuning.tune()  # as the worker runs
    shape = SHAPES[args.shape]
    lines = fleet(
        shape.workflows, shape.per_workflow, ZOMBIE_EVERY, live=shape.live, life=shape.life
    )
    lines = lines[: args.events]
    input_bytes = sum(len(raw) for raw in lines)
    made = batches(lines, args.partitions, args.per_transaction)
    raw = [framed(b) for b in made.batches]
    raw_bytes = sum(len(r) for r in raw)
    print(
        f"{len(lines):,} events of the {args.shape} fleet history, {args.per_transaction} per "
        f"transaction over {args.partitions} partitions: {len(raw):,} batches, "
        f"{raw_bytes / input_bytes:.3f} raw bytes per input byte"
    )
    print(
        f"  the processing step {made.step_s / len(lines) * 1e6:.1f} us per event, encoding "
        f"the changed states {made.encode_s / len(lines) * 1e6:.1f} us per event"
    )
    for level in args.levels:
        compressor = zstandard.ZstdCompressor(level=level)
        started = time.perf_counter()
        size = sum(len(compressor.compress(r)) + BATCH_OVERHEAD for r in raw)
        took = time.perf_counter() - started
        print(
            f"  zstd {level:2d}: {size / input_bytes:.3f} bytes per input byte, "
            f"{took / raw_bytes * 1e9:.1f} ns per raw byte"
        )


if __name__ == "__main__":
    main()
