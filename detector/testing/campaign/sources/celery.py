"""Celery on Redis: `acks_late` tasks, three prefork workers (one process each) of
`detector.testing.campaign.celery_worker`, on Debian's `redis-server` (persistent, so that a
restart keeps the queue and the unacknowledged messages).

The zombie: a worker paused inside a task past the 3 s visibility timeout; the Redis transport
restores the message and another worker runs it and charges; the paused one wakes and charges
too. Every worker reaches Redis through a proxy of its own (the partition); the fleet submits
the run's units from the campaign's process, straight to Redis.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, TypeVar

from detector.demos.celery import READY, says, worker_argv
from detector.devstack.needs import missing_package, missing_redis_server
from detector.devstack.redis import LocalRedis
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.kills import WHY, Kills
from detector.testing.campaign.nemesis import Fault, Proc, Step
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.proxy import TcpProxy

log = logging.getLogger(__name__)

MODULE: Final = "detector.testing.campaign.celery_worker"
# What the worker module (`MODULE`) and the fleet share:
BROKER_ENV: Final = "SPLITBRAIN_CAMPAIGN_CELERY_BROKER"  # the worker's Redis URL (its proxy)
WORKER_ENV: Final = "SPLITBRAIN_CAMPAIGN_CELERY_WORKER"  # its index in the fleet
TASK: Final = "campaign.charge"
QUEUE: Final = "celery"  # the default queue's Redis list
DONE_KEY: Final = "campaign:done"  # task ids whose charge was made (by any delivery)
BUSY_KEY: Final = "campaign:busy:"  # + worker index: lives while the worker is inside work
FAULT_KEY: Final = "campaign:fault:"  # + worker index: RETRY or HANDOFF while the key lives
RETRY: Final = "retry"  # the task raises after its work and retries (`Task.retry`)
HANDOFF: Final = "handoff"  # the task lets go of its message (`Reject(requeue=True)`)
# Without its Redis counter the adapter gives every later delivery epoch 2 (`FLAG_FROM`).
FLAG_BLIND: Final = "flag_epoch"
UNITS: Final = 30  # per run, one charge each
SUBMIT_EVERY_S: Final = 0.5
WORK_S: Final = (0.5, 1.3)  # each unit's work before its charge: under the visibility timeout
READY_S: Final = 60.0
# Idle this long with units not charged: they were lost (longer than a restore scan and a
# retry's countdown).
LOST_AFTER_S: Final = 5.0


def executor(n: int) -> str:
    """Worker `n`'s name in its events and in the truth: Celery's `workerN@%h`."""
    return f"worker{n}@{socket.gethostname()}"


_T = TypeVar("_T")


def redis_retried(call: Callable[[], _T], deadline_s: float = 60.0) -> _T:
    """A call to Redis from the campaign or its workers, waiting out a restart the nemesis made:
    a partition or a restart outlasting `deadline_s` fails it."""
    import redis  # noqa: PLC0415

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class _Fleet:
    """One run's workers, their proxies and the stream of units."""

    redis: LocalRedis
    client: Any  # redis.Redis, straight to the server
    procs: list[Proc]
    proxies: list[TcpProxy]
    kills: Kills
    submitted: threading.Event = field(default_factory=threading.Event)
    _heal_at: float = 0.0
    _threads: list[threading.Thread] = field(default_factory=list)

    def apply(self, step: Step) -> None:
        self._heal_at = max(self._heal_at, time.monotonic() + step.hold_s)
        match step.fault:
            case Fault.PARTITION:
                proxy = self.proxies[step.target]
                proxy.cut()
                self._later(step.hold_s, proxy.restore)
            case Fault.EXCEPTION_RETRY | Fault.HANDOFF:
                mode = RETRY if step.fault is Fault.EXCEPTION_RETRY else HANDOFF
                ms = int(step.hold_s * 1000)
                redis_retried(lambda: self.client.set(f"{FAULT_KEY}{step.target}", mode, px=ms))
            case Fault.PAUSE_PAST_LEASE:
                self._inside_work(step.target)
                self._signal(step)
            case Fault.COORDINATOR_RESTART:
                self.redis.stop()
                self._later(step.hold_s, self.redis.start)
            case _:
                self._signal(step)

    def _signal(self, step: Step) -> None:
        """A fault to a worker's process (pause, kill, shutdown), noted for what an exit drops."""
        with self.kills.exiting(executor(step.target), step):
            self.procs[step.target].apply(step)

    def _inside_work(self, target: int) -> None:
        """Wait (a unit's work at most) for `target` to be inside a task: a pause of an idle
        worker makes no zombie, only a late fetch."""
        deadline = time.monotonic() + WORK_S[1]
        while time.monotonic() < deadline and not redis_retried(
            lambda: self.client.exists(f"{BUSY_KEY}{target}")
        ):
            time.sleep(0.02)

    def _later(self, seconds: float, action: Any) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        self._threads.append(timer)

    def drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        time.sleep(max(0.0, self._heal_at - time.monotonic()))
        for thread in self._threads:
            thread.join()
        for proxy in self.proxies:
            proxy.restore()
        for proc in self.procs:
            proc.start()
            proc.resume()
        self.submitted.wait(max(0.0, deadline - time.monotonic()))

        def state() -> tuple[int, bool]:
            """(units charged, whether nothing is queued, unacknowledged or being worked on)."""
            pipe = self.client.pipeline(transaction=False)
            pipe.scard(DONE_KEY).llen(QUEUE).zcard("unacked_index")
            for n in range(len(self.procs)):
                pipe.exists(f"{BUSY_KEY}{n}")
            done, *pending = pipe.execute()
            return int(done), not any(pending)

        idle_since: float | None = None
        while time.monotonic() < deadline:
            done, idle = redis_retried(state)
            if done == UNITS:
                return True
            # Nothing left anywhere, and still units not charged: messages the transport lost
            # (a worker killed while Redis handed it one, between BRPOP and its unacked record).
            idle_since = (idle_since or time.monotonic()) if idle else None
            if idle_since is not None and time.monotonic() - idle_since > LOST_AFTER_S:
                log.warning("celery campaign: %d unit(s) lost by the transport", UNITS - done)
                return True
            time.sleep(0.2)
        return False


@dataclass
class _Session:
    env: CampaignEnv
    redis: LocalRedis
    workers: int

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[_Fleet]:
        import redis  # noqa: PLC0415
        from celery import Celery  # noqa: PLC0415

        client = redis.Redis.from_url(self.redis.url)
        client.flushall()  # the last run's keys and leftovers
        proxies = [TcpProxy("127.0.0.1", self.redis.port) for _ in range(self.workers)]
        procs = [
            Proc(
                f"celery-{n}",
                worker_argv(n, MODULE),
                env.process_env(
                    **{BROKER_ENV: f"redis://127.0.0.1:{proxies[n].port}/0", WORKER_ENV: str(n)},
                ),
                env.workdir / f"celery-{n}.log",
            )
            for n in range(self.workers)
        ]
        fleet = _Fleet(self.redis, client, procs, proxies, Kills(env.campaign.outages))
        stop = threading.Event()
        app = Celery("splitbrain-campaign-client", broker=self.redis.url)

        def submit() -> None:
            for n in range(UNITS):
                args = [f"{env.run}-{n}", round(env.rng.uniform(*WORK_S), 2)]
                task_id = str(uuid.uuid4())
                while not stop.is_set():
                    try:
                        app.send_task(TASK, args=args, task_id=task_id)
                        break
                    except Exception:  # a restart the nemesis made: again
                        time.sleep(0.2)
                if stop.wait(SUBMIT_EVERY_S):
                    return
            fleet.submitted.set()

        submitter = threading.Thread(target=submit, name="campaign-celery-submit", daemon=True)
        try:
            for proc in procs:
                proc.start()
            deadline = time.monotonic() + READY_S
            while not all(says(p.log, READY) for p in procs):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Celery workers not ready in {READY_S:g}s: {env.workdir}")
                time.sleep(0.1)
            submitter.start()
            yield fleet
        finally:
            stop.set()
            for proc in procs:
                proc.stop()
            fleet.kills.mark(env.truth)
            for proxy in proxies:
                proxy.close()
            if submitter.is_alive():
                submitter.join()
            app.close()
            client.close()


class CelerySource:
    name = "celery"
    # No CLOCK_STEP: under Debian's libfaketime 0.9.10 with the monotonic clock left alone
    # (`nemesis.clock_env`), Python 3.11's time.sleep fails with EINVAL (clock_nanosleep with
    # TIMER_ABSTIME on CLOCK_MONOTONIC, libfaketime issue 426), so no worker could run a task.
    faults = frozenset(
        {
            Fault.PAUSE_PAST_LEASE,
            Fault.CRASH_RESTART,
            Fault.PARTITION,
            Fault.GRACEFUL_SHUTDOWN,
            Fault.EXCEPTION_RETRY,
            Fault.HANDOFF,
            Fault.COORDINATOR_RESTART,
        }
    )
    holds = MappingProxyType(
        {
            Fault.PAUSE_PAST_LEASE: (
                5.0,
                8.0,
            ),  # past the 3 s visibility timeout and a restore scan
            Fault.CRASH_RESTART: (0.5, 2.0),
            Fault.PARTITION: (2.0, 6.0),
            Fault.GRACEFUL_SHUTDOWN: (0.5, 2.0),
            Fault.EXCEPTION_RETRY: (1.0, 3.0),
            Fault.HANDOFF: (1.0, 3.0),
            Fault.COORDINATOR_RESTART: (0.5, 2.0),
        }
    )
    workers = 3
    span_s = 12.0
    steps = 3
    # No `seq` on the adapter's events (the broker keeps no order of a task's deliveries); the
    # worker says it charged (`effect_committed` from the worker, as a task writes it).
    grade = Grade(ordering="arrival", destination_confirms=False)
    blind = MappingProxyType(
        {
            FLAG_BLIND: (
                "without its Redis counter (the INCR failed at receipt) the adapter gives every "
                "later delivery epoch 2, so two of them are one owner to it"
            ),
            **WHY,
        }
    )

    def missing(self) -> str | None:
        return missing_package("celery", "celery", "redis") or missing_redis_server()

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[_Session]:
        with LocalRedis(persist=True) as server:
            yield _Session(env, server, self.workers)


def source() -> CelerySource:
    return CelerySource()
