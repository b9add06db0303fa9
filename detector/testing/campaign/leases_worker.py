"""A campaign worker of the lease store, and its recording destination.

    python -m detector.testing.campaign.leases_worker --worker-id w0 --job-class '{...}' \
        --destination NAME [--unfenced] --fail-flag PATH --ready PATH [--work-s 0.6:1.4]

The product's own `Runner` claims jobs (the DSN from `SPLITBRAIN_LEASES_DSN`, its
`ownership_uncertain` events to the campaign's input topic). Its tool is one blocking call, as a
request to a remote system is: it works for a while, then makes the job's effect at a
`FencedDestination` in the store's database (fenced, or unfenced so that a displaced owner's
effect really happens). The call cannot be taken back once it started: a worker paused inside it
past its lease wakes and writes, a zombie. When the store does not answer, the call tries again
until it does (the idempotency key makes that safe), so a partitioned worker writes once the
partition heals.

The ground truth is written by the effect itself, in the destination's transaction (which holds
the job's row locked): the job's current fencing token, state and owner, read there, beside the
fence presented (`campaign_effects`). A refused effect's receipt (`fenced_receipts`) holds the
token it was compared with, and the store's refusal of a displaced owner's result says whether
the job's token had moved on. `export` turns them into the run's truth log once the run is over,
so no crash of a worker can separate an effect from its record, and no stepped worker clock
dates it (the database's clock does).

`--fail-flag`: when that file exists, the next call removes it and raises a retryable
`ToolFailed` before its effect (the nemesis's retry after an exception). SIGTERM ends the worker
after its current job.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import queue
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg.rows import DictRow

from detector.contracts.topics import INPUT_TOPIC
from detector.kafka.emit import Emitter
from detector.leases.db import connect
from detector.leases.destination import EffectRequest, FencedDestination
from detector.leases.errors import StoreUnavailableError
from detector.leases.policy import JobClass
from detector.leases.runner import Runner, ToolCall, ToolFailed
from detector.testing.campaign.truth import TruthLog
from detector.testing.campaign.worker import TOPIC_ENV

log = logging.getLogger(__name__)

# How long one call keeps trying a store that does not answer before it gives up (retryably).
UNANSWERED_S: Final = 30.0

# The recording destination's own table: the effect, and the store's word on its fence at it.
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS campaign_effects (
    id bigserial PRIMARY KEY,
    destination text NOT NULL,
    job_id uuid NOT NULL,
    effect_key text NOT NULL,
    worker_id text NOT NULL,
    fence bigint NOT NULL,
    token bigint NOT NULL,
    state text NOT NULL,
    owner_id text,
    lease_held boolean NOT NULL,
    at double precision NOT NULL
)
"""
# Inside the receipt's transaction, which took the job's row lock (its next seq) first.
_JOB_NOW: Final = """
SELECT fencing_token, state, owner_id, coalesce(lease_until > clock_timestamp(), false) AS held
  FROM tool_jobs WHERE id = %(job_id)s
"""
_EFFECT: Final = """
INSERT INTO campaign_effects
       (destination, job_id, effect_key, worker_id, fence, token, state, owner_id, lease_held, at)
VALUES (%(destination)s, %(job_id)s, %(effect_key)s, %(worker_id)s, %(fence)s, %(token)s,
        %(state)s, %(owner_id)s, %(held)s, extract(epoch FROM clock_timestamp()))
RETURNING id
"""
_EFFECTS: Final = """
SELECT job_id, effect_key, worker_id, fence, token, state, owner_id, lease_held, at
  FROM campaign_effects WHERE destination = %s
"""
_REFUSALS: Final = """
SELECT r.job_id, r.effect_key, r.worker_id, r.fence, r.fence_held,
       extract(epoch FROM r.created_at) AS at
  FROM fenced_receipts AS r WHERE r.destination = %s AND NOT r.accepted
"""
# The job table is a destination too, the result's: a displaced owner's `complete` or `fail` is
# refused there, and the store records why in the refusing transaction, from the job's row it
# holds locked (`LeaseStore._while_held`): `taken_over` or `cancelled` when the job's token had
# moved on. That record is the store's own, its outbox row; the truth takes only the reason.
_RESULTS_REFUSED: Final = """
SELECT o.job_id, o.event->>'owner_id' AS worker_id, (o.event->>'fencing_token')::bigint AS fence,
       o.event->'detail'->>'reason' AS reason, o.event->'detail'->>'attempted' AS attempted,
       extract(epoch FROM o.created_at) AS at
  FROM tool_job_outbox AS o JOIN tool_jobs AS j ON j.id = o.job_id
 WHERE j.job_class = %s AND o.event->>'kind' = 'result_rejected'
"""
RESULT_KEY: Final = "result"  # the key DESIGN §3 gives a `result_rejected` that names none
_MOVED_ON: Final = ("taken_over", "cancelled")
# A write under the job's token after the store ended the job without issuing a new one (its
# attempts used up while its lease had lapsed): no acquisition displaced the writer.
NO_TAKEOVER: Final = "finished_without_takeover"


def _effect(destination: str, request: EffectRequest) -> Any:
    def make(conn: psycopg.Connection[DictRow]) -> Any:
        job = conn.execute(_JOB_NOW, {"job_id": request.job_id}).fetchone()
        assert job is not None  # the destination found the job before it ran the effect
        row = conn.execute(
            _EFFECT,
            {
                "destination": destination,
                "job_id": request.job_id,
                "effect_key": request.key,
                "worker_id": request.worker_id,
                "fence": request.fence,
                "token": job["fencing_token"],
                "state": job["state"],
                "owner_id": job["owner_id"],
                "held": job["held"],
            },
        ).fetchone()
        assert row is not None
        return {"effect_id": row["id"]}

    return make


def export(dsn: str, destination: str, job_class: str, truth: TruthLog) -> None:
    """Write the run's effects and refusals at `destination`, and the results the job table
    refused, to its truth log, in the order they were made."""
    with connect(dsn) as conn:
        effects = conn.execute(_EFFECTS, (destination,)).fetchall()
        refusals = conn.execute(_REFUSALS, (destination,)).fetchall()
        results = conn.execute(_RESULTS_REFUSED, (job_class,)).fetchall()
    made = [(float(r["at"]), "made", r) for r in effects]
    refused = [(float(r["at"]), "refused", r) for r in refusals]
    rejected = [(float(r["at"]), "result", r) for r in results]
    for at, what, r in sorted(made + refused + rejected, key=lambda m: m[0]):
        if what == "result":
            moved_on = r["reason"] in _MOVED_ON
            truth.record(
                workflow_key=str(r["job_id"]),
                effect_key=RESULT_KEY,
                executor=r["worker_id"],
                epoch=r["fence"],
                owned=not moved_on,
                evidence=f"tool_jobs refused the {r['attempted']}: {r['reason']}",
                committed=False,
                at=at,
            )
            continue
        committed = what == "made"
        if committed:
            owned = r["fence"] == r["token"] and r["state"] == "running"
            lease = "lease held" if r["lease_held"] else "lease lapsed"
            evidence = (
                f"jobs.fencing_token={r['token']} state={r['state']} owner={r['owner_id']} "
                f"({lease}) at the write"
            )
            same_token = r["fence"] == r["token"]
        else:
            owned = False
            evidence = f"refused: the job's token was {r['fence_held']} at the write"
            same_token = r["fence"] == r["fence_held"]
        truth.record(
            workflow_key=str(r["job_id"]),
            effect_key=r["effect_key"],
            executor=r["worker_id"],
            epoch=r["fence"],
            owned=owned,
            evidence=evidence,
            committed=committed,
            blind=NO_TAKEOVER if not owned and same_token else None,
            at=at,
        )


class CampaignTool:
    """Works for a while, then makes the call's effect (see the module's docstring)."""

    def __init__(
        self,
        dsn: str,
        destination: str,
        *,
        fenced: bool,
        work_s: tuple[float, float],
        fail_flag: Path,
        rng: random.Random,
    ) -> None:
        self._dsn = dsn
        self._name = destination
        self._fenced = fenced
        self._work_s = work_s
        self._fail_flag = fail_flag
        self._rng = rng
        # One connection per destination object; calls that outlive their execution overlap.
        self._idle: queue.SimpleQueue[FencedDestination] = queue.SimpleQueue()

    async def __call__(self, call: ToolCall) -> Any:
        return await asyncio.to_thread(self._call, call)

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get().close()

    def _call(self, call: ToolCall) -> Any:
        _sleep(self._rng.uniform(*self._work_s))
        with contextlib.suppress(FileNotFoundError):
            self._fail_flag.unlink()
            raise ToolFailed("campaign_fault", retryable=True)
        request = EffectRequest(
            job_id=call.job_id,
            worker_id=call.worker_id,
            fence=call.fencing_token,
            idempotency_key=call.idempotency_key,
            entity=str(call.payload["entity"]),
            attempt=call.attempt,
        )
        give_up = time.monotonic() + UNANSWERED_S
        while True:
            try:
                destination = self._take()
                try:
                    receipt = destination.apply(request, _effect(self._name, request))
                finally:
                    self._idle.put(destination)
            except StoreUnavailableError as exc:
                if time.monotonic() > give_up:
                    raise ToolFailed("destination_unavailable", retryable=True) from exc
                _sleep(0.2)
                continue
            return {"status": receipt.status, "seq": receipt.seq}

    def _take(self) -> FencedDestination:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return FencedDestination(self._dsn, self._name, fenced=self._fenced)


def _sleep(seconds: float) -> None:
    """`time.sleep`, which fails with EINVAL under libfaketime 0.9.10 when the monotonic clock is
    left alone (`nemesis.clock_env`): Python 3.11 sleeps to an absolute monotonic time, which
    the library converts as if it were a wall-clock time."""
    threading.Event().wait(seconds)


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


async def _main(args: argparse.Namespace, dsn: str) -> None:
    job_class: JobClass = args.job_class
    emitter = Emitter.from_env(topic=os.environ.get(TOPIC_ENV, INPUT_TOPIC))
    while True:  # a worker started during a partition or a restart waits for the store
        try:
            runner = Runner(
                dsn, [job_class], args.worker_id, emitter=emitter, destination=args.destination
            )
            break
        except StoreUnavailableError as exc:
            log.warning("store unavailable at start: %s", exc)
            await asyncio.sleep(0.5)
    args.ready.touch()
    tool = CampaignTool(
        dsn,
        args.destination,
        fenced=not args.unfenced,
        work_s=args.work_s,
        fail_flag=args.fail_flag,
        rng=random.Random(args.seed),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await runner.run(job_class.name, tool, stop, idle_s=0.1)
    finally:
        runner.close()
        tool.close()
        emitter.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m detector.testing.campaign.leases_worker")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--job-class", required=True, type=JobClass.model_validate_json)
    parser.add_argument("--destination", required=True)
    parser.add_argument("--unfenced", action="store_true", help="accept every fence")
    parser.add_argument("--fail-flag", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True, help="touched once the store answers")
    parser.add_argument("--work-s", type=_span, default=(0.6, 1.4), metavar="MIN:MAX")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    dsn = os.environ.get("SPLITBRAIN_LEASES_DSN")
    if not dsn:
        parser.error("SPLITBRAIN_LEASES_DSN is not set")
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s {args.worker_id} %(name)s %(message)s",
    )
    asyncio.run(_main(args, dsn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
