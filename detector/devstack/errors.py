"""The dev stack's errors: one that names the component, why and where its log is, and one for
a machine or flags that cannot run the stack at all."""

from __future__ import annotations

from detector.errors import ExitCode, SplitbrainError


class StackError(SplitbrainError, RuntimeError):
    """A component did not start or stop; the message says which, why and where its log is."""


class UnusableError(StackError):
    """The machine or the flags cannot run the stack (no Java, a busy port, a state directory
    in use): found before anything was started."""

    exit_code = ExitCode.UNUSABLE
