"""The `splitbrain` command: each subcommand is registered by the module that owns it."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from detector import gc_tuning, version
from detector.errors import ExitCode

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
    return parser


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
    return code
