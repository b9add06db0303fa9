"""Histories on disk: JSONL events or job-queue logfmt lines, read the same way by every command.

A history may be gzip-compressed (recognised by its magic bytes, so also on standard input) and
may start with a UTF-8 byte order mark. A line is at most `MAX_EVENT_BYTES`, as a Kafka record
is in the worker; a longer one is refused as a bad line, and reading never holds more of it than
the limit. Input that is not text at all is refused as a whole: a history must never be audited
as "clean" because none of it could be read.
"""

from __future__ import annotations

import gzip
import io
import sys
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from detector.contracts.events import (
    MAX_EVENT_BYTES,
    EventError,
    OwnershipEvent,
    parse_event_json,
    parse_event_obj,
)
from detector.errors import SplitbrainError
from detector.histories.logfmt import LogfmtError, parse_logfmt_line

GZIP_MAGIC: Final = b"\x1f\x8b"
UTF8_BOM: Final = b"\xef\xbb\xbf"
_SNIFF_BYTES: Final = 8192
# Room for a line end, and one byte more than the limit, so a cut line is seen to be too long.
_READ_LIMIT: Final = MAX_EVENT_BYTES + 3


class UnusableHistoryError(SplitbrainError, OSError):
    """The input as a whole is not a history (binary data, a broken gzip stream, a closed
    standard input). An OSError, so every command reports it as it reports an unreadable file."""


@dataclass(frozen=True, slots=True)
class BadLine:
    lineno: int
    error: EventError

    def describe(self) -> str:
        return f"line {self.lineno}: {self.error}"


@dataclass(frozen=True, slots=True)
class GoodLine:
    """A valid event; `event.dropped_fields` lists the invalid optional fields it was read
    without."""

    lineno: int
    event: OwnershipEvent

    def drops(self) -> list[str]:
        """One line per dropped field, for a command to report."""
        return [
            f"line {self.lineno}: dropped {d} (the event is kept)"
            for d in self.event.dropped_fields
        ]


def parse_line(lineno: int, raw: bytes) -> GoodLine | BadLine:
    """A line starting with `{` is JSON; anything else is logfmt whose first bare word is the kind.

    Job-queue logs rarely carry event ids, so a logfmt line without one is named by its line.
    Bytes that are not UTF-8 cost a logfmt line only where they cost a JSON one: in a required
    field. Errors are kept without their traceback: a history may have millions of bad lines.
    """
    raw = raw.rstrip(b"\r\n")
    if len(raw) > MAX_EVENT_BYTES:
        reason = f"too_large: the line has more than {MAX_EVENT_BYTES} bytes, the limit of an event"
        return BadLine(lineno, EventError(reason))
    try:
        if raw.lstrip().startswith(b"{"):
            return GoodLine(lineno, parse_event_json(raw.strip()))
        obj, dropped = parse_logfmt_line(raw.decode("utf-8", "surrogateescape"))
        obj.setdefault("event_id", f"line-{lineno}")
        return GoodLine(lineno, parse_event_obj(obj, dropped))
    except EventError as exc:
        return BadLine(lineno, exc.detached())
    except LogfmtError as exc:
        return BadLine(lineno, EventError(str(exc)))


def read_history(lines: Iterable[bytes]) -> Iterator[GoodLine | BadLine]:
    """Every non-blank line, parsed; a byte order mark before the first line is not part of it."""
    for lineno, line in enumerate(lines, start=1):
        if lineno == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]  # noqa: PLW2901 (the first line, without its BOM)
        if line.strip():
            yield parse_line(lineno, line)


class _Readable(Protocol):
    def peek(self, size: int, /) -> bytes: ...
    def read(self, size: int, /) -> bytes: ...
    def seek(self, offset: int, /) -> object: ...  # what gzip asks of a file object
    def readline(self, size: int, /) -> bytes: ...


def bounded_lines(stream: _Readable) -> Iterator[bytes]:
    """The lines of a stream, each cut at the event limit: a longer line yields its first
    `_READ_LIMIT` bytes (which `parse_line` refuses) and the rest is read past, never kept."""
    while line := stream.readline(_READ_LIMIT):
        if len(line) == _READ_LIMIT and not line.endswith(b"\n"):
            while (rest := stream.readline(_READ_LIMIT)) and not rest.endswith(b"\n"):
                pass
        yield line


def _refuse_binary(stream: _Readable, once: str = "") -> None:
    if b"\x00" in stream.peek(_SNIFF_BYTES)[:_SNIFF_BYTES]:
        raise UnusableHistoryError(
            f"binary data{once} (a NUL byte near the start), not UTF-8 lines of JSON or "
            "logfmt (gzip is read transparently)"
        )


def history_lines(stream: _Readable) -> Iterator[bytes]:
    """The lines of a history file or pipe, gunzipped when it starts with gzip's magic bytes."""
    if not stream.peek(len(GZIP_MAGIC)).startswith(GZIP_MAGIC):
        _refuse_binary(stream)
        yield from bounded_lines(stream)
        return
    gz = gzip.GzipFile(fileobj=stream, mode="rb")
    count = 0
    try:
        _refuse_binary(gz, " once gunzipped")
        for line in bounded_lines(gz):
            count += 1
            yield line
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise UnusableHistoryError(f"the gzip stream is broken after line {count}: {exc}") from None


@contextmanager
def open_history(path: str) -> Iterator[Iterator[bytes]]:
    """The lines of a history; `-` is standard input. A missing or unreadable file raises
    OSError, input that is no history raises `UnusableHistoryError` (also an OSError)."""
    if path == "-":
        stdin = sys.stdin.buffer if sys.stdin is not None else None
        if not isinstance(stdin, io.BufferedReader):
            raise UnusableHistoryError("standard input is closed")
        yield history_lines(stdin)
        return
    with Path(path).open("rb") as fh:
        yield history_lines(fh)
