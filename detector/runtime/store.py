"""Where a worker keeps one partition's workflow states between events.

The changelog topic is the durable copy; a local store only holds it for processing. `memory`
keeps states in a dict: a restored state stays encoded until the engine first touches it, so a
restore costs what reading the changelog costs (`bench/bench_recovery.py`). `rocksdb` (optional,
the `rocksdb` extra) keeps them encoded on local disk, with only the workflows touched since the
last commit decoded in memory, for partitions whose state does not fit in memory. Both keep a
few bytes per encoded state (`detector.core.SweepMarks`) for the idle sweep not to decode them.
Both are rebuilt from the changelog on every assignment, so a wiped state directory loses
nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Protocol

from detector.core import SweepMarks, WorkflowState, decode_state, sweep_marks
from detector.runtime.settings import StoreKind


class Store(Protocol):
    @property
    def states(self) -> MutableMapping[str, WorkflowState]: ...

    def load(self, key: str, raw: bytes | None) -> None:
        """A changelog record read while restoring; None removes the workflow."""

    def put(self, key: str, raw: bytes | None) -> None:
        """A state just written to the changelog in the open transaction."""

    def committed(self) -> None:
        """The transaction that covered every `put` so far committed."""

    def close(self) -> None: ...


class DecodedCache(MutableMapping[str, WorkflowState]):
    """States kept encoded somewhere, decoded once on first use and kept in `_live`.

    The engine changes the objects it gets in place, so the decoded copy is what counts until
    the owner writes it back; subclasses say where the encoded bytes live.
    """

    _live: dict[str, WorkflowState]

    def _raw(self, key: str) -> bytes | None:
        raise NotImplementedError

    def __getitem__(self, key: str) -> WorkflowState:
        state = self.get(key)
        if state is None:
            raise KeyError(key)
        return state

    def get(self, key: str, default: WorkflowState | None = None) -> WorkflowState | None:  # type: ignore[override]
        """Without the exception `Mapping.get` would raise and catch for every new workflow."""
        state = self._live.get(key)
        if state is None:
            raw = self._raw(key)
            if raw is None:
                return default
            state = self._live[key] = decode_state(raw)
        return state


class _MarkedCache(DecodedCache):
    """A `DecodedCache` that is also `detector.core.SweptStates`: it keeps the `SweepMarks` of
    the states it holds encoded, so that a sweep of `Detector.advance` decodes only those that
    are due (a restore of 10⁶ states would otherwise be decoded again by the first tick)."""

    _marks: dict[str, SweepMarks]

    def sweep_keys(self, idle_before: float, expired_before: float) -> list[str]:
        live = self._live
        due = [
            key
            for key, (last_at, watched, remnant) in self._marks.items()
            if key not in live
            and (
                watched
                or (
                    last_at is None or last_at <= expired_before
                    if remnant
                    else last_at is not None and last_at <= idle_before
                )
            )
        ]
        return [*live, *due]


class MemoryStore(_MarkedCache):
    """Restored states stay encoded until the engine first touches them; decoded ones stay."""

    def __init__(self) -> None:
        self._live: dict[str, WorkflowState] = {}
        self._encoded: dict[str, bytes] = {}
        self._marks: dict[str, SweepMarks] = {}

    @property
    def states(self) -> MutableMapping[str, WorkflowState]:
        return self

    def _raw(self, key: str) -> bytes | None:
        self._marks.pop(key, None)
        return self._encoded.pop(key, None)

    def __setitem__(self, key: str, state: WorkflowState) -> None:
        self._live[key] = state
        self._encoded.pop(key, None)
        self._marks.pop(key, None)

    def __delitem__(self, key: str) -> None:
        if self._live.pop(key, None) is None:
            if self._encoded.pop(key, None) is None:
                raise KeyError(key)
            del self._marks[key]

    def __contains__(self, key: object) -> bool:
        return key in self._live or key in self._encoded

    def __iter__(self) -> Iterator[str]:
        yield from list(self._live)
        yield from list(self._encoded)

    def __len__(self) -> int:
        return len(self._live) + len(self._encoded)

    def load(self, key: str, raw: bytes | None) -> None:
        self._live.pop(key, None)
        if raw is None:
            self._encoded.pop(key, None)
            self._marks.pop(key, None)
        else:
            self._encoded[key] = raw
            self._marks[key] = sweep_marks(raw)

    def put(self, key: str, raw: bytes | None) -> None:
        """Nothing to do: the decoded copy the engine changed is the state."""

    def committed(self) -> None:
        pass

    def close(self) -> None:
        self._live.clear()
        self._encoded.clear()
        self._marks.clear()


class RocksStore(_MarkedCache):
    """Encoded states in RocksDB; the workflows touched since the last commit, decoded."""

    def __init__(self, path: Path) -> None:
        from rocksdict import Rdict  # noqa: PLC0415 (optional dependency)

        shutil.rmtree(path, ignore_errors=True)  # rebuilt from the changelog, never trusted
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._db = Rdict(str(path))
        self._live: dict[str, WorkflowState] = {}
        self._marks: dict[str, SweepMarks] = {}  # every state in the database
        self._gone: set[str] = set()
        self._stored = 0  # keys in the database: the gauge reads the length every few seconds

    @property
    def states(self) -> MutableMapping[str, WorkflowState]:
        return self

    def _raw(self, key: str) -> bytes | None:
        if key in self._gone:
            return None
        raw = self._db.get(key.encode())
        return raw if isinstance(raw, bytes) else None

    def __setitem__(self, key: str, state: WorkflowState) -> None:
        self._live[key] = state
        self._gone.discard(key)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._live.pop(key, None)
        self._gone.add(key)
        self._marks.pop(key, None)

    def __contains__(self, key: object) -> bool:
        if key in self._live:
            return True
        return isinstance(key, str) and key not in self._gone and key.encode() in self._db

    def __iter__(self) -> Iterator[str]:
        for raw_key in self._db.keys():  # noqa: SIM118 (Rdict is not iterable itself)
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            if key not in self._gone and key not in self._live:
                yield key
        yield from list(self._live)

    def __len__(self) -> int:
        # Only the few workflows touched since the last commit need a lookup.
        added = sum(1 for key in self._live if key.encode() not in self._db)
        removed = sum(1 for key in self._gone if key.encode() in self._db)
        return self._stored + added - removed

    def load(self, key: str, raw: bytes | None) -> None:
        self.put(key, raw)

    def put(self, key: str, raw: bytes | None) -> None:
        raw_key = key.encode()
        present = raw_key in self._db
        if raw is None:
            self._marks.pop(key, None)
            if present:
                self._db.delete(raw_key)
                self._stored -= 1
        else:
            state = self._live.get(key)  # the state `raw` encodes, when the engine wrote it
            self._marks[key] = sweep_marks(raw) if state is None else SweepMarks.of(state)
            self._db[raw_key] = raw
            self._stored += not present

    def committed(self) -> None:
        """What was worth keeping was `put`; the decoded copies can go."""
        self._live.clear()
        self._gone.clear()

    def close(self) -> None:
        self._db.close()
        self._marks.clear()
        shutil.rmtree(self._path, ignore_errors=True)


def open_store(kind: StoreKind, directory: Path, partition: int) -> Store:
    if kind == "rocksdb":
        return RocksStore(directory / f"partition-{partition}")
    return MemoryStore()
