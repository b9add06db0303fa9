"""The product's one error base class, and the one table of exit codes its commands use.

A command does not print its errors: it raises them, and `detector.cli.main` prints each as one
line per problem and exits with the error's `exit_code`."""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """What a `splitbrain` command's status means, the same for every command."""

    OK = 0
    # audit: a finding reaches --fail-on, or --expect failed; topics apply: not reconciled;
    # replay: not every event was delivered; worker: crashed
    FAILED = 1
    UNUSABLE = 2  # the input, a flag, a variable or the cluster cannot be used; nothing was done
    FENCED = 3  # worker: a newer owner took its transactional id or partitions
    INTERRUPTED = 130  # Ctrl-C


class SplitbrainError(Exception):
    """Every error the product raises on purpose: its message says what to fix, one problem a
    line, and `exit_code` what a command that stops on it exits with. FAILED by default, the
    status an unexpected exception gives too."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class InputError(SplitbrainError):
    """A file, a flag or a variable a command was given cannot be used, and no more specific
    error says so."""

    exit_code = ExitCode.UNUSABLE


class Interrupted(SplitbrainError):  # noqa: N818 - Ctrl-C, no error, like KeyboardInterrupt
    """Ctrl-C stopped a command that says what it left behind."""

    exit_code = ExitCode.INTERRUPTED
