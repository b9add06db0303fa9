"""The faust runtime's commit barrier, with no broker: it never commits past a failure, past
the last finished event, or before every write of the transaction reached the broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from faust.types import TP

from detector.runtime.checkpoint import Checkpoint
from detector.runtime.faust.barrier import CommitBarrier, FaustRuntimeError


def new_barrier() -> CommitBarrier:
    return CommitBarrier(Checkpoint("out", "dlq", "changelog"))


def test_it_refuses_to_commit_past_the_last_event_the_agent_finished() -> None:
    barrier = new_barrier()
    barrier.checkpoint.offsets[("in", 0)] = 10
    barrier.check_offsets({TP("in", 0): 10})  # up to it: fine
    with pytest.raises(FaustRuntimeError, match="past the last event"):
        barrier.check_offsets({TP("in", 0): 11})
    with pytest.raises(FaustRuntimeError, match="refusing to commit after a failure"):
        barrier.check_usable()


def test_a_partition_never_processed_cannot_be_committed() -> None:
    with pytest.raises(FaustRuntimeError):
        new_barrier().check_offsets({TP("in", 1): 0})


def test_forgetting_a_revoked_partition_forgets_its_progress() -> None:
    barrier = new_barrier()
    barrier.checkpoint.offsets[("in", 2)] = 5
    barrier.checkpoint.forget([TP("in", 2)])
    assert barrier.checkpoint.offsets == {}


def test_drain_waits_for_every_write_and_a_failed_one_makes_it_unusable() -> None:
    async def scenario() -> CommitBarrier:
        barrier = new_barrier()
        loop = asyncio.get_running_loop()
        ok: asyncio.Future[None] = loop.create_future()
        barrier.track(ok)
        loop.call_soon(ok.set_result, None)
        await barrier.drain()
        assert barrier.pending == [] and barrier.failure is None
        broken: asyncio.Future[None] = loop.create_future()
        barrier.track(broken)
        loop.call_soon(broken.set_exception, OSError("broker gone"))
        with pytest.raises(OSError):
            await barrier.drain()
        return barrier

    barrier = asyncio.run(scenario())
    with pytest.raises(FaustRuntimeError):
        barrier.check_usable()


def test_a_crashed_worker_exits_while_its_consumer_thread_still_runs() -> None:
    """mode runs the consumer in a non-daemon thread; after a crash the event loop closes, the
    thread does not stop, and the process waited for it forever (alive, silent, never restarted).
    Here the thread never returns, and the process must still exit."""
    script = textwrap.dedent(
        """
        import threading
        from detector.runtime.faust.transport import EosConsumerThread

        class Stuck:  # stands in for the consumer service: its loop never ends
            def _start_thread(self) -> None:
                threading.Event().wait()

        thread = EosConsumerThread.Worker(Stuck())
        thread.start()
        print("daemon" if thread.daemon else "not a daemon", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "daemon"), done.stderr


def test_a_record_below_what_the_agent_finished_is_a_redelivery() -> None:
    """After a seek back to the committed offset, a record already finished (its outputs in the
    open transaction) must not run again: a dead letter has no state to tell the repeat."""
    barrier = new_barrier()
    assert not barrier.done("in", 0, 0)  # nothing finished yet: everything is new
    barrier.checkpoint.offsets[("in", 0)] = 624
    assert barrier.done("in", 0, 623) and not barrier.done("in", 0, 624)
    barrier.checkpoint.forget([TP("in", 0)])  # the partition moved: its open transaction ended
    assert not barrier.done("in", 0, 623)
