"""A campaign worker for LangGraph: a pod of a human-in-the-loop service that resumes threads.

A small scheduler's table (`campaign_jobs`, as a Kubernetes job controller would keep it) hands
each thread's resume to one worker at a time: a claim takes the job's next claim number and a
lease the worker extends while it runs; a claim whose lease ran out (the pod paused, cut off or
dead) is given to another worker, which resumes the same checkpoint. The resume is LangGraph's
own: the human's answer as `update_state` on the interrupted checkpoint, then `invoke(None)`
through `detector.demos.langgraph_graph`'s graph, under `SplitbrainCheckpointer.run`; its `work`
node writes the effect, a row of `campaign_effects`, with the adapter's calls around it.

Ground truth, from LangGraph's own table at the write, in the effect's transaction: the
checkpoints the worker's run and any other run of the job wrote as children of the job's
interrupted checkpoint (its *base*), each labelled with its run's claim number (LangGraph copies
the run's `metadata` into each checkpoint's). The executor owns the work iff no run that claimed
the job after it has written a child of the base: two children of one checkpoint, the later
claim's written while this run still works. A child of an earlier claim is no displacement (this
run is the newer owner; redoing the effect is a duplicate, which the checker counts apart).

Run as `python -m detector.testing.campaign.langgraph_worker NAME DSN READY AIM` (READY: a file
it creates once it can claim; AIM: its aim file, `aim.hold_here`) with the campaign's
environment (`RunEnv.process_env`). SIGTERM: finish the job at hand, flush, exit; SIGUSR1: the
next `work` node raises before its effect (the worker resumes the same checkpoint again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from detector.adapters import current, effect_attempted, effect_committed
from detector.adapters.langgraph import (
    PostgresThreads,
    SplitbrainCheckpointer,
    fork_effect_key,
)
from detector.demos.langgraph_graph import Graph, build
from detector.testing.campaign.aim import Inside, hold_here
from detector.testing.campaign.nemesis import sleep_on_stepped_clock
from detector.testing.campaign.truth import TruthLog, owner_of
from detector.testing.campaign.worker import sink

log = logging.getLogger(__name__)

CLAIM_S: Final = 2.0  # a claim's lease: the scheduler gives the job away once it runs out
HEARTBEAT_S: Final = 0.4
MAX_CLAIMS: Final = 6  # then the scheduler gives the job up
ATTEMPTS: Final = 12  # resumes of one run after its graph raised (a partition lasts seconds)
RETRY_S: Final = 0.5
DESTINATION: Final = "campaign_effects"

# The scheduler's table and the recording destination, beside LangGraph's own tables.
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS campaign_jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run         integer NOT NULL,
    thread_id   text NOT NULL UNIQUE,
    base        text NOT NULL,  -- the interrupted checkpoint to resume
    think_s     double precision NOT NULL,  -- the work node's duration
    slot        integer NOT NULL,  -- its place in the run's order of release
    not_before  timestamptz,  -- claimable from then on (the human answered)
    state       text NOT NULL DEFAULT 'queued',  -- queued, running, done, failed
    claim       integer NOT NULL DEFAULT 0,
    owner       text,
    lease_until timestamptz
);
CREATE TABLE IF NOT EXISTS campaign_effects (
    thread_id  text NOT NULL,
    effect_key text NOT NULL,
    claim      integer NOT NULL,
    worker     text NOT NULL,
    epoch      bigint,  -- the run's, as the adapter gave it (none: a run it did not watch)
    owned      boolean NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

_CLAIM: Final = """
UPDATE campaign_jobs AS j
   SET claim = j.claim + 1, owner = %(owner)s, state = 'running',
       lease_until = now() + make_interval(secs => %(lease)s)
  FROM (SELECT id FROM campaign_jobs
         WHERE (state = 'queued' OR (state = 'running' AND lease_until < now()))
           AND claim < %(max)s AND not_before <= now()
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) AS next
 WHERE j.id = next.id
RETURNING j.id, j.thread_id, j.base, j.think_s, j.claim
"""
_GIVE_UP: Final = """
UPDATE campaign_jobs SET state = 'failed'
 WHERE state = 'running' AND lease_until < now() AND claim >= %(max)s
"""
_EXTEND: Final = """
UPDATE campaign_jobs SET lease_until = now() + make_interval(secs => %(lease)s)
 WHERE id = %(id)s AND claim = %(claim)s AND state = 'running'
"""
_DONE: Final = "UPDATE campaign_jobs SET state = 'done' WHERE id = %s AND claim = %s"
# The run's latest checkpoint (uuid6 ids grow within one process, whatever its clock does).
_HEAD: Final = """
SELECT checkpoint_id FROM checkpoints
 WHERE thread_id = %s AND checkpoint_ns = '' AND (metadata ->> 'claim')::integer = %s
 ORDER BY checkpoint_id DESC LIMIT 1
"""
# The base's children written by runs that claimed the job after `claim`.
_LATER_CHILDREN: Final = """
SELECT checkpoint_id, (metadata ->> 'claim')::integer AS claim
  FROM checkpoints
 WHERE thread_id = %(thread)s AND checkpoint_ns = '' AND parent_checkpoint_id = %(base)s
   AND (metadata ->> 'claim')::integer > %(claim)s
 ORDER BY claim
"""
# What PostgreSQL made in a run, for `recover`: each job's first child of its base as the
# adapter's ledger keeps it (its epoch and writer), and each effect row.
_FIRST_CHILDREN: Final = """
SELECT c.thread_id, c.parent_id, c.worker_id, c.epoch, extract(epoch FROM c.created_at) AS at
  FROM campaign_jobs AS j
  JOIN langgraph_children AS c
    ON c.thread_id = j.thread_id AND c.checkpoint_ns = '' AND c.parent_id = j.base
 WHERE j.run = %s
"""
_EFFECTS: Final = """
SELECT e.thread_id, e.effect_key, e.worker, e.epoch, e.owned,
       extract(epoch FROM e.written_at) AS at
  FROM campaign_effects AS e JOIN campaign_jobs AS j USING (thread_id)
 WHERE j.run = %s
"""


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    thread_id: str
    base: str
    think_s: float
    claim: int

    def config(self) -> RunnableConfig:
        """The run's config: the base pinned (never "the latest", which LangGraph picks by the
        writers' clocks), the claim in the metadata LangGraph copies into each checkpoint."""
        return {
            "configurable": {"thread_id": self.thread_id, "checkpoint_id": self.base},
            "metadata": {"claim": self.claim, "base": self.base},
        }


def owned_at(conn: psycopg.Connection[DictRow], job: Job) -> tuple[bool, str]:
    """LangGraph's record, now: whether no later claim wrote a child of the job's base, and what
    the record said."""
    rows = conn.execute(
        _LATER_CHILDREN, {"thread": job.thread_id, "base": job.base, "claim": job.claim}
    ).fetchall()
    if not rows:
        return True, f"checkpoint {job.base} has no child of a claim after {job.claim}"
    later = ", ".join(f"{r['checkpoint_id']} (claim {r['claim']})" for r in rows)
    return False, f"checkpoint {job.base} already has child {later}; this run is claim {job.claim}"


class Pod:
    """One worker process: its connections, its checkpointer, its graph."""

    def __init__(self, name: str, dsn: str, aim: Path) -> None:
        self.name = name
        self.dsn = dsn
        self.aim = aim
        self.truth = TruthLog.from_env()
        self.sink = sink("langgraph")
        self.ledger = PostgresThreads(dsn)
        self.stopping = threading.Event()
        self.fail_next = threading.Event()
        self._job: Job | None = None
        self._db: psycopg.Connection[DictRow] | None = None

    # ---- connections --------------------------------------------------------------------------

    def db(self) -> psycopg.Connection[DictRow]:
        """The scheduler's and destination's connection, opened again after it broke."""
        if self._db is None or self._db.closed or self._db.broken:
            self._db = psycopg.connect(
                self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=3
            )
        return self._db

    @contextlib.contextmanager
    def graph(self) -> Iterator[tuple[SplitbrainCheckpointer, Graph]]:
        """The saver on a pool that checks its connections, so that a saver outlives a
        partition or a database restart, as a service's would."""
        kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        with ConnectionPool(
            self.dsn,
            connection_class=psycopg.Connection[DictRow],
            kwargs={**kwargs, "connect_timeout": 3},
            min_size=1,
            max_size=2,
            timeout=5,
            check=ConnectionPool.check_connection,
        ) as pool:
            checkpointer = SplitbrainCheckpointer(
                PostgresSaver(pool), threads=self.ledger, sink=self.sink, worker_id=self.name
            )
            try:
                yield checkpointer, build(checkpointer, during_work=self.work)
            finally:
                checkpointer.flush(5)

    # ---- the loop -----------------------------------------------------------------------------

    def serve(self, ready: Path) -> None:
        threading.Thread(target=self._heartbeat, name="claim-lease", daemon=True).start()
        while not self.stopping.is_set():
            try:
                with self.graph() as (checkpointer, graph):
                    ready.touch()
                    while not self.stopping.is_set():
                        job = self.claim()
                        if job is None:
                            time.sleep(0.1)
                            continue
                        self.resume(checkpointer, graph, job)
            except psycopg.Error as exc:  # the database restarted or was cut off: connect again
                log.info("%s: %s", self.name, type(exc).__name__)
                self._job = None
                time.sleep(0.3)
        self.sink.flush(10)

    def claim(self) -> Job | None:
        db = self.db()
        args = {"owner": self.name, "lease": CLAIM_S, "max": MAX_CLAIMS}
        db.execute(_GIVE_UP, args)
        row = db.execute(_CLAIM, args).fetchone()
        if row is None:
            return None
        self._job = Job(row["id"], row["thread_id"], row["base"], row["think_s"], row["claim"])
        return self._job

    def resume(self, checkpointer: SplitbrainCheckpointer, graph: Graph, job: Job) -> None:
        """The human's answer on the base, then the graph from there; a run that raised resumes
        its own latest checkpoint again, as the same owner (a run never writes a second child of
        the base)."""
        config = job.config()
        with checkpointer.run(config):
            for attempt in range(ATTEMPTS):
                try:
                    head = self.head(job)
                    if head is None:
                        graph.update_state(config, {"notes": [f"approved, for {self.name}"]})
                        self.record_child(job)
                        head = self.head(job)
                    resume: RunnableConfig = {
                        "configurable": {"thread_id": job.thread_id, "checkpoint_id": head},
                        "metadata": config["metadata"],
                    }
                    graph.invoke(None, resume)
                    break
                except Exception as exc:
                    log.info("%s: attempt %d raised %s", self.name, attempt, type(exc).__name__)
                    time.sleep(RETRY_S)
        self.db().execute(_DONE, (job.id, job.claim))
        self._job = None

    def head(self, job: Job) -> str | None:
        row = self.db().execute(_HEAD, (job.thread_id, job.claim)).fetchone()
        return None if row is None else str(row["checkpoint_id"])

    def _heartbeat(self) -> None:
        """The claim's lease, extended while the job runs (a paused process extends nothing)."""
        conn: psycopg.Connection[DictRow] | None = None
        while True:
            time.sleep(HEARTBEAT_S)
            job = self._job
            if job is None:
                continue
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                conn.execute(_EXTEND, {"lease": CLAIM_S, "id": job.id, "claim": job.claim})
            except psycopg.Error:
                conn = None

    # ---- the effects and their truth ----------------------------------------------------------

    def record_child(self, job: Job) -> None:
        """The run's child of the base as a write of the key the adapter names a fork by: the
        thread's next state, made again by a second run on the checkpoint."""
        owned, evidence = owned_at(self.db(), job)
        self._record(job, fork_effect_key(job.base), owned, evidence)

    def work(self, config: RunnableConfig) -> None:
        """The `work` node: think, then the effect, attempted and written in the transaction
        that reads LangGraph's record. An aimed pause lands before the think, while the run
        holds its claim (a run the ledger did not watch is no owner to displace)."""
        meta = config.get("metadata") or {}
        job = Job(0, config["configurable"]["thread_id"], meta["base"], 0.0, meta["claim"])
        if self.fail_next.is_set():
            self.fail_next.clear()
            raise RuntimeError("injected failure before the effect")
        key = f"reply/{job.thread_id}"
        owner = current()
        if owner is not None:
            hold_here(self.aim, Inside(**owner_of(owner), effect_key=key, pid=os.getpid()))
        think = self._job.think_s if self._job is not None else 0.3
        time.sleep(think)
        db = self.db()
        with db.transaction():
            owned, evidence = owned_at(db, job)
            effect_attempted(key, destination=DESTINATION)
            db.execute(
                "INSERT INTO campaign_effects (thread_id, effect_key, claim, worker, epoch, owned)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    job.thread_id,
                    key,
                    job.claim,
                    self.name,
                    owner.owner_epoch if owner else None,
                    owned,
                ),
            )
        effect_committed(key, destination=DESTINATION, by_destination=True)
        self._record(job, key, owned, evidence)

    def _record(self, job: Job, key: str, owned: bool, evidence: str) -> None:
        if self.truth is None:
            return
        owner = current()
        self.truth.record(
            workflow_key=job.thread_id if owner is None else owner.workflow_key,
            effect_key=key,
            executor=self.name if owner is None else owner.worker_id,
            epoch=0 if owner is None else owner.owner_epoch,
            owned=owned,
            evidence=evidence,
            # The ledger could not be reached when the run began: the adapter ran it unwatched.
            blind="unwatched_run" if owner is None else None,
        )


def recover(dsn: str, truth: TruthLog) -> int:
    """Record the writes PostgreSQL made whose pod died before recording them (a SIGKILL between
    the write and its record); how many. A reply is read back from its row, judged in its own
    transaction. A child of a base is read back from the adapter's ledger, which keeps each
    base's first child with its epoch and writer: owned, no child having preceded it. (A later
    child is not kept there: its writer's death before its record leaves it out still.)"""
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        children = conn.execute(_FIRST_CHILDREN, (truth.run,)).fetchall()
        effects = conn.execute(_EFFECTS, (truth.run,)).fetchall()
    made = [
        {
            **r,
            "effect_key": fork_effect_key(r["parent_id"]),
            "worker": r["worker_id"],
            "owned": True,
        }
        for r in children
    ] + effects
    recorded = Counter(
        (w.workflow_key, w.effect_key, w.executor, w.epoch) for w in truth.writes() if w.committed
    )
    found = 0
    for row in made:
        epoch = row["epoch"] or 0  # none: a run the adapter did not watch, recorded under 0
        key = (row["thread_id"], row["effect_key"], row["worker"], epoch)
        if recorded[key]:
            recorded[key] -= 1
            continue
        truth.record(
            workflow_key=row["thread_id"],
            effect_key=row["effect_key"],
            executor=row["worker"],
            epoch=epoch,
            owned=row["owned"],
            evidence="recovered from PostgreSQL: its pod died before recording it",
            at=float(row["at"]),
            blind="unwatched_run" if row["epoch"] is None else None,
        )
        found += 1
    return found


def main(argv: list[str] | None = None) -> int:
    sleep_on_stepped_clock()
    name, dsn, ready, aim = (argv or sys.argv[1:])[:4]
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(name)s %(message)s")
    pod = Pod(name, dsn, Path(aim))

    def stop(signum: int, frame: FrameType | None) -> None:
        pod.stopping.set()

    def fail(signum: int, frame: FrameType | None) -> None:
        pod.fail_next.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, fail)
    pod.serve(Path(ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
