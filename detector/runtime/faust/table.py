"""The changelog-backed table of per-workflow state, and one partition's view of it as the
engine wants it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, cast

import faust
from faust.types import TP, EventT

from detector.core import WorkflowState
from detector.runtime.faust.transport import SplitbrainApp
from detector.runtime.store import DecodedCache

log = logging.getLogger(__name__)

TABLE_NAME: Final = "state"  # faust names its changelog "{app id}-state-changelog"


class StateTable(faust.Table):  # type: ignore[type-arg]
    """The table of `encode_state` bytes; it tells the worker which keys recovery brought in
    (per partition). The worker writes its changelog itself, with the rest of the transaction
    (`detector.runtime.checkpoint`): the table only holds the bytes and reads them back."""

    def __init__(self, *args: Any, keys: dict[int, set[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys_by_partition: dict[int, set[str]] = {} if keys is None else keys
        self.on_assignment: Callable[[set[TP]], None] | None = None
        self.rebalanced_at: float | None = None

    async def on_rebalance(
        self,
        assigned: set[TP],
        revoked: set[TP],
        newly_assigned: set[TP],
        generation_id: int = 0,
    ) -> None:
        """Before recovery starts: let the worker drop what moved to other workers."""
        self.rebalanced_at = time.monotonic()
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        if self.on_assignment is not None:
            self.on_assignment(assigned)

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        """The table holds its changelog up to the end: processing starts now."""
        await super().on_recovery_completed(active_tps, standby_tps)
        if self.rebalanced_at is not None:
            elapsed = time.monotonic() - self.rebalanced_at
            self.rebalanced_at = None
            cast(SplitbrainApp, self.app).metrics.restored(elapsed)
            # active_tps are changelog partitions, numbered as the input's (co-partitioned)
            restored = sorted(tp.partition for tp in active_tps)
            log.info("restored partitions %s in %.2fs", restored, elapsed)

    def apply_changelog_batch(self, batch: Iterable[EventT[Any]]) -> None:
        events = list(batch)
        super().apply_changelog_batch(events)
        for event in events:
            raw_key = event.message.key
            if raw_key is None:
                continue
            keys = self.keys_by_partition.setdefault(event.message.partition, set())
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            if event.message.value is None:
                keys.discard(key)
            else:
                keys.add(key)


class PartitionStates(DecodedCache):
    """One partition's workflows, as the engine wants them: decoded objects, kept decoded.

    The table holds the bytes the changelog holds: the checkpoint `put`s a workflow's after the
    engine changed it (in place) or evicted it, when it writes them to the changelog.
    """

    def __init__(self, table: StateTable, partition: int) -> None:
        self._table = table
        self._keys = table.keys_by_partition.setdefault(partition, set())
        self._live: dict[str, WorkflowState] = {}

    def _raw(self, key: str) -> bytes | None:
        return self._table.data.get(key.encode()) if key in self._keys else None

    def __setitem__(self, key: str, state: WorkflowState) -> None:
        self._live[key] = state
        self._keys.add(key)

    def __delitem__(self, key: str) -> None:
        if key not in self._keys:
            raise KeyError(key)
        self._keys.discard(key)
        self._live.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def put(self, key: str, raw: bytes | None) -> None:
        """The local copy only: the checkpoint writes the changelog record."""
        if raw is None:
            self._table.data.pop(key.encode(), None)
        else:
            self._table.data[key.encode()] = raw
