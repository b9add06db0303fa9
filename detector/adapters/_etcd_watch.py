"""etcd's v3 JSON gateway, read directly: ranges and watches with their revisions.

etcd3gw's own watcher drops what a lock watcher must see: a watch cancelled by compaction ends
its iterator without a word, and the header revision is not passed on. This module reads the
gateway's stream itself and hands on every response, compaction and progress included, as
`WatchResponse`. Keys and values are base64 in the gateway's JSON; int64s are strings.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.utils import _encode, _increment_last_byte
from urllib3.exceptions import ReadTimeoutError

from ._watch import UnreadableError


class InvalidKvError(UnreadableError):
    """A key-value the gateway sent that cannot be read."""

    noun = "key"


@dataclass(frozen=True, slots=True)
class Kv:
    key: str
    create_revision: int
    mod_revision: int
    lease: int  # 0: no lease

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "create_revision": self.create_revision,
            "mod_revision": self.mod_revision,
            "lease": self.lease,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Kv:
        return cls(
            str(doc["key"]),
            int(doc["create_revision"]),
            int(doc["mod_revision"]),
            int(doc["lease"]),
        )


@dataclass(frozen=True, slots=True)
class Change:
    deleted: bool
    kv: Kv


@dataclass(frozen=True, slots=True)
class WatchResponse:
    """One gateway response: `revision` is the store's when it was sent; `changes` may span
    several revisions (each change's `kv.mod_revision` says which)."""

    revision: int
    changes: list[Change] = field(default_factory=list)
    invalid: list[InvalidKvError] = field(default_factory=list)
    compact_revision: int = 0  # > 0: the watch was cancelled because history was compacted
    canceled: bool = False


def _int(doc: Mapping[str, Any], name: str, key: str, *, default: int | None = None) -> int:
    raw = doc.get(name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidKvError(f"bad_{name}", key) from None
    if value < 0:
        raise InvalidKvError(f"bad_{name}", key)
    return value


def parse_kv(doc: Mapping[str, Any], *, deleted: bool = False) -> Kv:
    """A gateway key-value; raises `InvalidKvError`. A DELETE's kv carries only key and revision."""
    try:
        key = base64.b64decode(doc["key"], validate=True).decode("utf-8")
    except (KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidKvError("bad_key", str(doc.get("key"))[:256]) from None
    mod = _int(doc, "mod_revision", key)
    if deleted:
        return Kv(key, 0, mod, 0)
    create = _int(doc, "create_revision", key)
    if create == 0 or create > mod:
        raise InvalidKvError("bad_create_revision", key)
    return Kv(key, create, mod, _int(doc, "lease", key, default=0))


def parse_response(doc: Mapping[str, Any]) -> WatchResponse:
    """One line of the gateway's watch stream (`{"result": {...}}`)."""
    result = doc.get("result")
    if not isinstance(result, Mapping):
        error = doc.get("error", doc)
        raise ConnectionError(f"etcd watch error: {str(error)[:200]}")
    revision = _int(result.get("header", {}), "revision", "(header)", default=0)
    changes: list[Change] = []
    invalid: list[InvalidKvError] = []
    for event in result.get("events", []):
        deleted = event.get("type") == "DELETE"
        try:
            changes.append(Change(deleted, parse_kv(event.get("kv", {}), deleted=deleted)))
        except InvalidKvError as exc:
            invalid.append(exc)
    return WatchResponse(
        revision,
        changes,
        invalid,
        compact_revision=_int(result, "compact_revision", "(watch)", default=0),
        canceled=bool(result.get("canceled", False)),
    )


def list_prefix(client: Etcd3Client, prefix: str) -> tuple[int, list[Kv], list[InvalidKvError]]:
    """Every key under `prefix` now: the store's revision, the keys, and what could not be read."""
    doc = client.post(
        client.get_url("/kv/range"),
        json={"key": _encode(prefix), "range_end": _encode(_increment_last_byte(prefix))},
    )
    revision = _int(doc.get("header", {}), "revision", "(header)")
    kvs: list[Kv] = []
    invalid: list[InvalidKvError] = []
    for raw in doc.get("kvs", []):
        try:
            kvs.append(parse_kv(raw))
        except InvalidKvError as exc:
            invalid.append(exc)
    return revision, kvs, invalid


def lease_ttl(client: Etcd3Client, lease: int) -> tuple[int, int]:
    """The lease's remaining and granted seconds; remaining -1 once it expired or was revoked."""
    doc = client.post(client.get_url("/kv/lease/timetolive"), json={"ID": lease})
    return int(doc.get("TTL", -1)), int(doc.get("grantedTTL", 0))


def watch_prefix(
    client: Etcd3Client, prefix: str, start_revision: int, *, timeout: float = 60.0
) -> Iterator[WatchResponse]:
    """Responses of a watch on `prefix` from `start_revision`, with progress notifications (so a
    quiet prefix still moves its revision); ends when the server closes the stream."""
    create: dict[str, Any] = {
        "key": _encode(prefix),
        "range_end": _encode(_increment_last_byte(prefix)),
        "start_revision": start_revision,
        "progress_notify": True,
    }
    with client.session.post(
        client.get_url("/watch"),
        json={"create_request": create},
        stream=True,
        timeout=(5.0, timeout),
    ) as resp:
        resp.raise_for_status()
        buffer = b""
        try:
            # Chunks as they arrive (a fixed chunk size would wait for that many bytes).
            for chunk in resp.iter_content(chunk_size=None):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    doc = json.loads(line)
                    if doc.get("result", {}).get("created"):
                        continue
                    yield parse_response(doc)
        except requests.ConnectionError as exc:
            if not isinstance(exc.args[0] if exc.args else None, ReadTimeoutError):
                raise
            # Quiet for `timeout` seconds: the caller watches again from where it got.
