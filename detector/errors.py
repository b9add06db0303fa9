"""The product's one error base class, and the one table of exit codes its commands use."""

from __future__ import annotations

from enum import IntEnum


class SplitbrainError(Exception):
    """Every error the product raises on purpose: its message says what to fix."""


class ExitCode(IntEnum):
    """What a `splitbrain` command's status means, the same for every command."""

    OK = 0
    # audit: a finding reaches --fail-on, or --expect failed; topics apply: not reconciled;
    # replay: not every event was delivered; worker: crashed
    FAILED = 1
    UNUSABLE = 2  # the input, a flag, a variable or the cluster cannot be used; nothing was done
    FENCED = 3  # worker: a newer owner took its transactional id or partitions
    INTERRUPTED = 130  # Ctrl-C
