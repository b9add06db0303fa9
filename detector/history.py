"""Histories on disk: JSONL events or job-queue logfmt lines, read the same way by every command."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from detector.events import EventError, OwnershipEvent, parse_event_json, parse_event_obj
from detector.logfmt import LogfmtError, parse_logfmt_line


@dataclass(frozen=True, slots=True)
class BadLine:
    lineno: int
    error: EventError

    def describe(self) -> str:
        return f"line {self.lineno}: {self.error}"


@dataclass(frozen=True, slots=True)
class GoodLine:
    lineno: int
    event: OwnershipEvent


def parse_line(lineno: int, raw: bytes) -> GoodLine | BadLine:
    """A line starting with `{` is JSON; anything else is logfmt whose first bare word is the kind.

    Job-queue logs rarely carry event ids, so a logfmt line without one is named by its line.
    """
    try:
        if raw.lstrip().startswith(b"{"):
            return GoodLine(lineno, parse_event_json(raw.strip()))
        obj = parse_logfmt_line(raw.decode("utf-8"))
        obj.setdefault("event_id", f"line-{lineno}")
        return GoodLine(lineno, parse_event_obj(obj))
    except EventError as exc:
        return BadLine(lineno, exc)
    except LogfmtError as exc:
        return BadLine(lineno, EventError(str(exc)))
    except UnicodeDecodeError as exc:
        return BadLine(lineno, EventError(f"not UTF-8 at byte {exc.start}"))


def read_history(lines: Iterable[bytes]) -> Iterator[GoodLine | BadLine]:
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            yield parse_line(lineno, line)


@contextmanager
def open_history(path: str) -> Iterator[BinaryIO]:
    """`-` is standard input; a missing or unreadable file raises OSError."""
    if path == "-":
        yield sys.stdin.buffer
        return
    with Path(path).open("rb") as fh:
        yield fh
