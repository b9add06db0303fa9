"""The commit barrier: what the agent and the consumer share so that a faust commit is an
exactly-once commit for us."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from faust.types import TP

from detector.errors import SplitbrainError
from detector.runtime.checkpoint import Checkpoint

DRAIN_TIMEOUT_S: Final = 60.0


class FaustRuntimeError(SplitbrainError, RuntimeError):
    """The cluster or the settings do not allow this worker to run; the message says why."""


# ------------------------------------------------------------------------- the commit barrier


@dataclass(slots=True)
class CommitBarrier:
    """What makes a faust commit an exactly-once commit for us.

    The agent holds `lock` from the first write of an event until the event is done, and the
    consumer holds it while it commits, so a transaction never ends in the middle of an event.
    `pending` holds the delivery futures of every record written since the last commit; the
    commit waits for all of them, so it cannot leave a changelog write or a finding behind in
    the next transaction. The `checkpoint`'s offsets are the next offset after the last event
    the agent finished, per input partition, kept while the partition (and its open
    transaction) stays with this worker: they are what the commit takes, and a record below one
    is a redelivery. Once `failure` is set the worker has half-done work in its open
    transactions and must not commit again.
    """

    checkpoint: Checkpoint
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: list[asyncio.Future[Any]] = field(default_factory=list)
    failure: BaseException | None = None

    def track(self, fut: Awaitable[Any]) -> None:
        self.pending.append(asyncio.ensure_future(fut))

    def fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc

    def check_usable(self) -> None:
        if self.failure is not None:
            raise FaustRuntimeError(
                f"refusing to commit after a failure ({self.failure!r}): the open transactions "
                "may hold half an event; Kafka aborts them and the next worker redoes it"
            ) from self.failure

    async def drain(self) -> None:
        """Wait until every record written since the last commit is on the broker."""
        pending, self.pending = self.pending, []
        if pending:
            try:
                await asyncio.wait_for(asyncio.gather(*pending), DRAIN_TIMEOUT_S)
            except BaseException as exc:
                self.fail(exc)
                raise

    def check_offsets(self, offsets: Mapping[TP, int]) -> None:
        for tp, offset in offsets.items():
            done = self.checkpoint.offsets.get((tp.topic, tp.partition))
            if done is None or offset > done:
                exc = FaustRuntimeError(
                    f"faust wanted to commit {tp.topic}[{tp.partition}] at {offset}, past the "
                    f"last event the agent finished ({done}); refusing (faust #606)"
                )
                self.fail(exc)
                raise exc

    def done(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the agent finished this record already, since this worker got its partition.

        Its outputs are then in the partition's open transaction or a committed one: a seek
        back to the committed offset redelivers it, and a dead letter has no state that would
        let the engine see the repeat."""
        return offset < self.checkpoint.offsets.get((topic, partition), offset)
