"""The `splitbrain` command: each subcommand is registered by the module that owns it, and every
error a command stops on reaches its exit status here, in `main`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator, Sequence

from confluent_kafka import KafkaException

from detector import gc_tuning, version
from detector.errors import ExitCode, SplitbrainError
from detector.kafka.config import describe
from detector.report import printable

# Each module exposes `register(subparsers)`; keeping the list here is the only coupling.
_COMMAND_MODULES = (
    "detector.cli.audit",
    "detector.cli.worker",
    "detector.cli.dev",
    "detector.cli.topics",
    "detector.cli.replay",
    "detector.cli.tail",
    "detector.cli.leases",
    "detector.cli.page",
    "detector.cli.ui",
    "detector.cli.demo",
    "detector.cli.export",
    "detector.cli.watch",
    "detector.cli.probe",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitbrain",
        description="Detect displaced owners of leased workflows that are still acting.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # --version's lines as written
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version.describe(),
        help="print the package's version and the versions of the formats it reads and writes",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for words, command in subcommands(parser):
        command.set_defaults(command_name=" ".join(words))  # what its errors are printed after
    return parser


def subcommands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Each command that runs, named by its words after `splitbrain`."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not nested:
        yield words, parser
    for action in nested:
        for name, sub in action.choices.items():
            yield from subcommands(sub, (*words, name))


def silence_stdout() -> None:
    """A reader such as `head` went away: send what is still buffered for standard output, and
    anything printed later, to /dev/null, so that neither this write nor the flush at exit
    fails again (which would print a traceback and change the exit status to 120)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (io.UnsupportedOperation is both)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    gc_tuning.tune()
    try:
        code: int = args.run(args)
    except BrokenPipeError:
        # Not an error of ours. A command whose exit status means something (`audit`) catches
        # this itself, after deciding its status; for the others, the reader had what it wanted.
        silence_stdout()
        return ExitCode.OK
    except Exception as exc:
        failure = _failure(exc)
        if failure is None:
            raise  # a bug: its traceback is what to report
        message, code = failure
        # Escaped: a file name, or the text of a hostile history, may be in the message.
        for line in [*message.splitlines(), *getattr(exc, "__notes__", ())]:
            print(printable(f"splitbrain {args.command_name}: {line}"), file=sys.stderr)
    return code


def _failure(exc: Exception) -> tuple[str, int] | None:
    """What a command that stopped on `exc` says and exits with: the product's errors carry
    both; the Kafka client's and the database driver's mean the cluster or the database cannot
    be used; anything else is a bug."""
    if isinstance(exc, SplitbrainError):
        return str(exc), exc.exit_code
    if isinstance(exc, KafkaException):
        return describe(exc), ExitCode.UNUSABLE
    psycopg = sys.modules.get("psycopg")  # imported by the commands that use a database only
    if psycopg is not None and isinstance(exc, psycopg.Error):
        from detector.leases.db import one_line  # noqa: PLC0415 (imports psycopg)

        return one_line(exc), ExitCode.UNUSABLE
    return None
