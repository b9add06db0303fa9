"""`splitbrain replay`: publish a recorded history to the input topic, in file order.

For load tests, incident reproduction and feeding a new detector the history `audit` judged:
each line goes through the same parser as `audit` and the same `Emitter` as the workers, so what
lands on the topic is exactly what a worker would have sent.
"""

from __future__ import annotations

import argparse
import sys
import time

from tqdm import tqdm

from detector.cli.arguments import positive_number, positive_seconds
from detector.contracts.topics import INPUT_TOPIC
from detector.errors import ExitCode, InputError, Interrupted
from detector.histories.reader import BadLine, open_history, read_history
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.kafka.emit import DEFAULT_FLUSH_TIMEOUT, Emitter
from detector.report import printable


class _Pacer:
    """Keeps to a schedule rather than sleeping a fixed gap after each send, so the time spent
    sending does not lower the rate."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next = time.monotonic()

    def wait(self) -> None:
        now = time.monotonic()
        if self._next > now:
            time.sleep(self._next - now)
        self._next = max(self._next, now) + self._interval


def run(args: argparse.Namespace) -> int:
    kafka = KafkaConnection.from_args(args).client_config()
    skipped = 0
    try:
        with (
            open_history(args.file) as fh,
            Emitter(kafka, topic=args.topic) as emitter,
            tqdm(desc="replay", unit="event", file=sys.stderr, disable=None) as bar,
        ):
            pacer = _Pacer(args.rate)
            for item in read_history(fh):
                if isinstance(item, BadLine):
                    skipped += 1
                    bar.write(printable(f"skipped {item.describe()}"), file=sys.stderr)
                    continue
                for message in item.drops():
                    bar.write(printable(message), file=sys.stderr)
                pacer.wait()
                emitter.emit(item.event)
                bar.update()
            emitter.flush(args.flush_timeout)
    except OSError as exc:
        raise InputError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None
    print(
        f"replayed {emitter.sent} event(s) to {args.topic}, skipped {skipped} invalid line(s)",
        file=sys.stderr,
    )
    return ExitCode.OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "replay",
        help="publish a history (JSONL or logfmt) to the input topic, in file order",
        description="Validate each line like `audit` and publish it keyed by workflow. Invalid "
        "lines are reported and skipped. Exit 0: every valid event was acknowledged; 1: some "
        "were not; 2: the input or the cluster cannot be used.",
    )
    p.add_argument("file", help="history file, one event per line; - for standard input")
    p.add_argument(
        "--rate",
        type=positive_number,
        metavar="N",
        help="at most N events per second (default: as fast as Kafka takes them)",
    )
    p.add_argument(
        "--topic", default=INPUT_TOPIC, metavar="NAME", help="the topic events are published to"
    )
    p.add_argument(
        "--flush-timeout",
        type=positive_seconds,
        default=DEFAULT_FLUSH_TIMEOUT,
        metavar="S",
        help=f"seconds to wait for the last acknowledgements (default: {DEFAULT_FLUSH_TIMEOUT:g})",
    )
    add_kafka_arguments(p)
    p.set_defaults(run=run)
