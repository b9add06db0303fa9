"""The redis-lock source: Debian's `redis-server` (persistent, so that a restart keeps the locks,
their fence counters and the ledgers) and three `redis_lock_worker` processes electing a leader
per shard with the adapter's `FencedLock` and writing their units to a ledger in Redis (see
`redis_lock_worker` for the ground truth).

No watcher: Redis tells nobody of a lapsed lock, so every event is the holders' own adapter's,
held in memory until Kafka takes it, and a worker's exit can take some along (the fleet notes
them for `kills`). Nor any `seq`: a holder's write just before its lock's next acquisition may
be heard after it (`HEARD_LATE`), its events held by a pause, by a partition that held back the
write's reply, or by a loaded machine; and a displaced holder's write just after it, or while a
Kafka outage holds both, before it (`HEARD_EARLY`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from detector.devstack.needs import missing_package, missing_redis_server
from detector.devstack.redis import LocalRedis
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.election import OTHER_TRY_S
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.campaign.sources import _election
from detector.testing.campaign.sources._election import SHARDS, python, work_args
from detector.testing.campaign.sources.etcd import EtcdSource
from detector.testing.campaign.truth import HEARD_EARLY, HEARD_LATE, heard_early, heard_late

TTL_S: Final = 2.0  # the locks' timeout: a holder that stops extending loses it this soon
UNITS: Final = 16  # per shard: about 10 s of work for its leader
# How long after a write its holder's events may still be unsent when its lock is next acquired:
# the lock lapses the timeout after the holder's last extend (before the write, or just after
# it), another worker tries it within a second, and a loaded machine can add a second.
HEARD_LATE_S: Final = TTL_S + OTHER_TRY_S + 1.0
# How long after an acquisition (or after the return of a broker that was down at it) its event
# may still be unsent: the sink lingers 20 ms, a loaded machine adds a second, and through an
# outage the producers try the broker about once a second.
HEARD_EARLY_S: Final = 1.0


@dataclass
class RedisLockSession:
    env: CampaignEnv
    server: LocalRedis

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[_election.ElectionFleet]:
        import redis  # noqa: PLC0415

        from detector.testing.campaign.redis_lock_worker import (  # noqa: PLC0415
            acquisitions,
            read_cursor,
        )

        root = f"campaign:r{env.run}"
        client = redis.Redis.from_url(self.server.url, socket_timeout=5.0)

        def done() -> bool:
            return all(read_cursor(client, root, k) >= UNITS for k in range(SHARDS))

        def worker(i: int, port: int) -> list[str]:
            return python(
                "detector.testing.campaign.redis_lock_worker",
                *("--url", f"redis://127.0.0.1:{port}/0", "--root", root),
                *("--ttl", str(TTL_S), *work_args(i, UNITS)),
            )

        try:
            with _election.fleet(
                env,
                watcher_argv=None,
                worker_argv=worker,
                port=self.server.port,
                done=done,
                restart_coordinator=_election.restarter(self.server),
            ) as fleet:
                yield fleet
            # Once every worker has stopped, and the exits' unsent writes are marked.
            acquired = acquisitions(client, root, SHARDS)
            heard_late(env.truth, acquired, HEARD_LATE_S)
            heard_early(env.truth, acquired, HEARD_EARLY_S, env.campaign.outages.spans)
        finally:
            client.close()


class RedisLockSource:
    name = "redis-lock"
    # No `seq` (Redis gives no order a worker can read); every write is Redis's own receipt.
    grade = Grade(ordering="arrival", destination_confirms=True)
    blind = _election.blind(
        **{
            HEARD_LATE: "a write, or its receipt when a partition held back the write's reply, "
            "less than the lock's timeout and a try before the lock's next acquisition: the "
            "events carry no seq, so one its holder's sink still held (a pause, that partition, "
            "a loaded machine) is heard after the acquisition and rightly called stale (DESIGN: "
            "ordered by arrival)",
            HEARD_EARLY: "a displaced holder's write less than a second after the acquisition "
            "that displaced it, or while Kafka was down at that acquisition: the events carry "
            "no seq, so the write may be heard first, within its holder's tenure, and no finding "
            "can call it stale (DESIGN: ordered by arrival)",
        }
    )
    # The election fleet's faults, and the same lapse as etcd's locks (a 2 s lease), so the same
    # schedule: a pause or a partition past it, or not.
    faults = _election.FAULTS
    holds = EtcdSource.holds
    workers = _election.WORKERS
    span_s = EtcdSource.span_s
    steps = EtcdSource.steps

    def missing(self) -> str | None:
        return missing_package("redis-lock", "redis") or missing_redis_server()

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[RedisLockSession]:
        with LocalRedis(persist=True) as server:
            yield RedisLockSession(env, server)


def source() -> RedisLockSource:
    return RedisLockSource()
