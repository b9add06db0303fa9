"""The Celery campaign's worker: a Celery app (run as `python -m celery -A
detector.testing.campaign.celery_worker worker`, prefork, one process) whose one task charges a
unit of work once, with the adapter installed as a user installs it.

The recording destination is the broker's own Redis, and so is the ground truth: each delivery
of a task records itself there when it starts (the task id's delivery counter); the charge is a
Lua script that, in the same atomic step, reads whether a later delivery of the task has started
since. The executor owned the work at its write iff none had: Redis's transport had not handed the
message to a worker that began it again. Never splitbrain's events.

Configured by the environment: `BROKER_ENV` (the Redis URL, through the worker's partition
proxy), `WORKER_ENV` (the fleet's index of this worker, for the faults aimed at it), the truth
log's and the sink's variables (`truth.TruthLog.from_env`, `worker.sink`).
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from typing import Any, Final

import redis
from celery import Celery, Task
from celery.exceptions import Reject

from detector.adapters import current, effect_attempted, effect_committed
from detector.adapters.celery import ADAPTER, FLAG_FROM, install
from detector.demos.celery import configure
from detector.testing.campaign.sources.celery import (
    BROKER_ENV,
    BUSY_KEY,
    DONE_KEY,
    FAULT_KEY,
    FLAG_BLIND,
    HANDOFF,
    RETRY,
    TASK,
    WORKER_ENV,
    redis_retried,
)
from detector.testing.campaign.truth import TruthLog
from detector.testing.campaign.worker import sink

EFFECTS_KEY: Final = "campaign:effects"  # effect key -> how many times it was made
RETRY_COUNTDOWN_S: Final = 0.3

# A delivery starts: its number among the task's deliveries (once per token, however often the
# call is repeated); its worker is inside work for the next ARGV[2] ms.
_START: Final = """
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local n = redis.call('HGET', KEYS[1], ARGV[1])
if n then return tonumber(n) end
n = redis.call('HINCRBY', KEYS[1], '#latest', 1)
redis.call('HSET', KEYS[1], ARGV[1], n)
return n
"""
# The charge, and the latest delivery started, in one step; then the server's time (a clock no
# worker's stepped clock moves). Once per token.
_CHARGE: Final = """
local latest = redis.call('HGET', KEYS[3], ARGV[1])
if not latest then
  latest = redis.call('HGET', KEYS[1], '#latest')
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  redis.call('HSET', KEYS[3], ARGV[1], latest)
end
local now = redis.call('TIME')
return {tonumber(latest), now[1], now[2]}
"""


class Destination:
    """The broker's Redis as the recording destination. Each call is retried through a
    partition or a server restart, and counts once however often it was made."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._start = self._client.register_script(_START)
        self._charge = self._client.register_script(_CHARGE)

    def start(self, task_id: str, worker: str, work_s: float) -> int:
        """Record a delivery of `task_id` beginning, on `worker` for `work_s`; its number
        (1, 2, …) in starting order."""
        keys = [_started(task_id), BUSY_KEY + worker]
        args: list[str | int] = [uuid.uuid4().hex, max(int(work_s * 1000), 1)]
        return int(redis_retried(lambda: self._start(keys=keys, args=args)))

    def charge(self, task_id: str, effect_key: str) -> tuple[int, float]:
        """Make the effect; the latest delivery of `task_id` started at that moment, and the
        server's time of it."""
        token = uuid.uuid4().hex
        keys = [_started(task_id), EFFECTS_KEY, f"campaign:charged:{task_id}"]
        latest, sec, usec = redis_retried(lambda: self._charge(keys=keys, args=[token, effect_key]))
        return int(latest), int(sec) + int(usec) / 1e6

    def fault(self, worker: str) -> str | None:
        value: Any = redis_retried(lambda: self._client.get(FAULT_KEY + worker))
        return None if value is None else bytes(value).decode()

    def done(self, task_id: str) -> None:
        redis_retried(lambda: self._client.sadd(DONE_KEY, task_id))


def _started(task_id: str) -> str:
    return f"campaign:started:{task_id}"


@functools.cache
def _destination() -> Destination:
    """One client per process (a pool's child makes its own after the fork)."""
    return Destination(os.environ[BROKER_ENV])


class InjectedError(RuntimeError):
    """The exception the nemesis makes a task raise before its effect."""


app = Celery("splitbrain-campaign", broker=os.environ.get(BROKER_ENV))
configure(app)
install(app, sink=sink(ADAPTER))


def charge(self: Task[Any, Any], unit: str, work_s: float) -> None:
    """Work `work_s` seconds, then charge `unit` once (`charge:<unit>`), as a user would write
    it: the adapter's effect calls around the write."""
    owner = current()
    truth = TruthLog.from_env()
    if owner is None or truth is None:
        raise RuntimeError("the campaign's task runs under the adapter and a truth log")
    destination = _destination()
    task_id = owner.workflow_key
    worker = os.environ.get(WORKER_ENV, "")
    delivery = destination.start(task_id, worker, work_s)
    time.sleep(work_s)
    fault = destination.fault(worker)
    if fault == RETRY:
        raise self.retry(exc=InjectedError("injected"), countdown=RETRY_COUNTDOWN_S)
    if fault == HANDOFF:
        raise Reject("handed off", requeue=True)
    key = f"charge:{unit}"
    effect_attempted(key, destination="redis")
    latest, at = destination.charge(task_id, key)
    truth.record(
        workflow_key=task_id,
        effect_key=key,
        executor=owner.worker_id,
        epoch=owner.owner_epoch,
        owned=latest == delivery,
        evidence=f"Redis: delivery {delivery} of the task; {latest} started at the write",
        at=at,
        blind=FLAG_BLIND if owner.epoch_from == FLAG_FROM else None,
    )
    effect_committed(key, destination="redis")
    destination.done(task_id)


app.task(bind=True, name=TASK, max_retries=None)(charge)
