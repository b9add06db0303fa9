"""A caller's values as the lease store and the fenced destination keep them: texts within a
length, JSON within a size, and the short digest that logs show instead of a value (a payload or
a result may hold what a log must not)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

from detector.leases.errors import LeaseInputError

# A payload, result or error as JSON, unless a store or destination is given another limit.
MAX_PAYLOAD_BYTES: Final = 64 * 1024
# A NUL as JSON writes it: `\u0000` after an even number of backslashes (an odd one escapes it).
_NUL: Final = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_text(field: str, value: object, limit: int) -> None:
    """`LeaseInputError` naming `field` unless `value` is a string of 1 to `limit` characters."""
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise LeaseInputError(field, f"expected a string of 1 to {limit} characters")


def json_text(field: str, value: Any, max_bytes: int) -> str:
    """`value` as the JSON the database will store; `LeaseInputError` naming `field` if it is
    not JSON, is nested deeper than Python can write, holds what PostgreSQL's `jsonb` cannot
    store (a NUL, a lone surrogate) or is larger than `max_bytes`."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(text.encode())
    except RecursionError:
        raise LeaseInputError(field, "nested too deeply to be written as JSON") from None
    except UnicodeEncodeError as exc:
        raise LeaseInputError(field, f"not storable text: {exc.reason} at {exc.start}") from None
    except (TypeError, ValueError) as exc:
        raise LeaseInputError(field, f"not JSON: {exc}") from None
    if _NUL.search(text):
        raise LeaseInputError(field, "holds a NUL character (\\u0000), which jsonb cannot store")
    if size > max_bytes:
        raise LeaseInputError(field, f"{size} bytes as JSON; the limit is {max_bytes}")
    return text


def digest(text: str) -> str:
    """The first 16 hex digits of the text's SHA-256: enough to match two logs' values."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
