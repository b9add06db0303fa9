"""The redis-lock source: Debian's `redis-server` (persistent, so that a restart keeps the locks,
their fence counters and the ledgers) and three `redis_lock_worker` processes electing a leader
per shard with the adapter's `FencedLock` and writing their units to a ledger in Redis (see
`redis_lock_worker` for the ground truth).

No watcher: Redis tells nobody of a lapsed lock, so every event is the holders' own adapter's,
held in memory until Kafka takes it, and a worker's exit can take some along (the fleet notes
them for `kills`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from detector.devstack.needs import missing_package, missing_redis_server
from detector.devstack.redis import LocalRedis
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.kills import WHY
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.campaign.sources import _election
from detector.testing.campaign.sources._election import SHARDS, python, work_args
from detector.testing.campaign.sources.etcd import EtcdSource

TTL_S: Final = 2.0  # the locks' timeout: a holder that stops extending loses it this soon
UNITS: Final = 16  # per shard: about 10 s of work for its leader


@dataclass
class RedisLockSession:
    env: CampaignEnv
    server: LocalRedis

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[_election.ElectionFleet]:
        import redis  # noqa: PLC0415

        from detector.testing.campaign.redis_lock_worker import read_cursor  # noqa: PLC0415

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
        finally:
            client.close()


class RedisLockSource:
    name = "redis-lock"
    # No `seq` (Redis gives no order a worker can read); every write is Redis's own receipt.
    grade = Grade(ordering="arrival", destination_confirms=True)
    blind = WHY
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
