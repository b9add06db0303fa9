"""A campaign worker holding redis-py locks: `python -m detector.testing.campaign.redis_lock_worker
--url URL --root R --shards N --units U --prefer K --ttl S` (Kafka, topic and truth log from the
environment the campaign gives it).

Each shard is a `Redis.lock` of the adapter's `FencedLock` class (`R:shard-K`, a timeout of
`--ttl` seconds). Its holder extends the lock before each unit (the heartbeat, and where a
displaced holder learns it: `LockNotOwnedError`), then: `effect_attempted`, the unit's work, the
write to the shard's ledger, and the cursor moved on only while its token still holds the lock.

The write is one Lua script that also reads the lock's fence counter (the ground truth, in the
same atomic step, on Redis's own clock): the executor owned the shard iff no acquisition since
its own has minted a fence, that is, the counter is still its fence. A lapsed lock that nobody
took since is owned so (Kleppmann's storage would still take the fence), and a successor's redo
of the unit is the duplicate. Every third unit is written through the fence: the ledger refuses a
fence below the highest it has taken (`effect_rejected`, the destination's receipt); the others
are plain writes that Redis confirms (`effect_committed`, also its receipt).

Each acquisition is noted too, on Redis's clock, right after it (`acquisitions`): the events carry
no `seq`, so a write just before the next acquisition of its lock may be heard after it
(`truth.heard_late`).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

import redis
from redis.exceptions import LockNotOwnedError

from detector.adapters import AdapterSink, effect_attempted, effect_committed, effect_rejected
from detector.adapters.redis_lock import DESTINATION, FencedLock, fenced_lock_class
from detector.testing.campaign import election
from detector.testing.campaign.truth import TruthLog, campaign_time
from detector.testing.campaign.worker import sink

log = logging.getLogger("campaign.redis-lock")

# KEYS: the fence counter, the lock, the shard's ledger (a hash: effect key -> writer, and
# '#fence' the highest fence a fenced write brought), the writes done (write id -> result).
# ARGV: the write id, the fence, the effect key, the writer, '1' for a fenced write, the token.
# Returns {the counter, whether the lock holds the token, applied, server seconds, microseconds};
# a repeated call (a reply lost to a partition) gets the first call's result and writes nothing.
_WRITE: Final = """
local done = redis.call('HGET', KEYS[4], ARGV[1])
if done then return cjson.decode(done) end
local counter = tonumber(redis.call('GET', KEYS[1]) or '0')
local held = redis.call('GET', KEYS[2]) == ARGV[6] and 1 or 0
local fence = tonumber(ARGV[2])
local applied = 1
if ARGV[5] == '1' then
  if fence < tonumber(redis.call('HGET', KEYS[3], '#fence') or '0') then
    applied = 0
  else
    redis.call('HSET', KEYS[3], '#fence', fence)
  end
end
if applied == 1 then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
local now = redis.call('TIME')
local result = {counter, held, applied, tonumber(now[1]), tonumber(now[2])}
redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(result))
return result
"""
# KEYS: the lock, the cursor; ARGV: the token, the next unit. Moves the cursor on (never back)
# while the token holds the lock; 1 when it holds it.
_ADVANCE: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
"""


# KEYS: the lock's acquisitions (a hash: fence -> server seconds). ARGV: the fence.
_ACQUIRED: Final = """
local now = redis.call('TIME')
redis.call('HSETNX', KEYS[1], ARGV[1], now[1] + now[2] / 1e6)
"""


def lock_name(root: str, shard: int) -> str:
    return f"{root}:shard-{shard}"


def cursor_key(root: str, shard: int) -> str:
    return f"{root}:cursor:shard-{shard}"


def connect(url: str) -> redis.Redis:
    """A worker's client: a partition fails its call within the timeout rather than hang it."""
    return redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


def read_cursor(client: redis.Redis, root: str, shard: int) -> int:
    return int(client.get(cursor_key(root, shard)) or 0)


def acquired_key(root: str, shard: int) -> str:
    return f"{lock_name(root, shard)}:acquired"


def acquisitions(client: redis.Redis, root: str, shards: int) -> list[tuple[str, int, float]]:
    """Every acquisition of the run's locks: workflow key (the lock's name), fence, when."""
    return [
        (lock_name(root, k), int(fence), float(at))
        for k in range(shards)
        for fence, at in client.hgetall(acquired_key(root, k)).items()
    ]


@dataclass
class RedisLockWorker:
    client: redis.Redis
    root: str
    units: int
    prefer: int
    ttl: float
    work_s: float
    orders: election.Orders = field(default_factory=election.Orders)
    sink: AdapterSink = field(default_factory=lambda: sink("redis-lock"))
    truth: TruthLog | None = field(default_factory=TruthLog.from_env)

    def __post_init__(self) -> None:
        self.lock_class = fenced_lock_class(self.sink)
        self._write = self.client.register_script(_WRITE)
        self._advance = self.client.register_script(_ADVANCE)
        self._acquired = self.client.register_script(_ACQUIRED)

    def run_shard(self, shard: int) -> None:
        preferred = shard == self.prefer
        self.orders.wait_for_the_preferred(preferred)
        while not self.orders.stopping.is_set():
            token = uuid.uuid4().hex
            lock: Any = self.client.lock(
                lock_name(self.root, shard), timeout=self.ttl, lock_class=self.lock_class
            )
            try:
                won = (
                    not self.orders.sitting_out()
                    and read_cursor(self.client, self.root, shard) < self.units
                    and lock.acquire(blocking=False, token=token)
                )
            except redis.RedisError as exc:
                log.info("shard %d: Redis unreachable (%s)", shard, type(exc).__name__)
                won = False
            if won:
                self.lead(lock, token, shard)
            else:
                self.orders.wait_to_try(preferred)

    def lead(self, lock: FencedLock, token: str, shard: int) -> None:
        since = self.orders.began()
        fence = lock.fence
        assert fence is not None
        log.info("leading shard %d (fence %s)", shard, fence)
        try:
            noted = [acquired_key(self.root, shard)]
            election.retrying(lambda: self._acquired(keys=noted, args=[fence]), "the note")
            while self.orders.leading(since) and self.unit(lock, token, shard):
                pass
            election.retrying(lock.release, "the release", fatal=(LockNotOwnedError,))
        except LockNotOwnedError:
            log.info("shard %d: the lock is no longer this holder's", shard)
        finally:
            self.orders.ended()

    def unit(self, lock: FencedLock, token: str, shard: int) -> bool:
        """One unit of the shard's work; False when done or displaced (its cursor stayed)."""
        index = election.retrying(lambda: read_cursor(self.client, self.root, shard), "the cursor")
        if index >= self.units:
            return False
        election.retrying(
            lambda: lock.extend(self.ttl, replace_ttl=True),
            "the extend",
            fatal=(LockNotOwnedError,),
        )
        key = election.effect_key(shard, index)
        effect_attempted(key, destination=DESTINATION)
        if self.orders.take_failure():
            log.info("%s failed before its effect; retrying it", key)
            return True
        time.sleep(self.work_s)
        if not self.write(lock, token, key, election.fenced(shard, index)):
            return False  # the ledger refused the fence: displaced
        cursor = [lock.name, cursor_key(self.root, shard)]
        return bool(
            election.retrying(lambda: self._advance(keys=cursor, args=[token, index + 1]), "cursor")
        )

    def write(self, lock: FencedLock, token: str, key: str, fenced: bool) -> bool:
        """The unit's write to the shard's ledger, the destination's receipt, and the truth read
        in the same script; whether the ledger took it."""
        ownership, fence = lock.ownership, lock.fence
        assert ownership is not None and fence is not None
        keys = [lock.fence_key, lock.name, f"{lock.name}:ledger", f"{self.root}:writes"]
        once = uuid.uuid4().hex  # the write's id: a call repeated after a lost reply counts once
        args: list[str | int] = [once, fence, key, ownership.worker_id, int(fenced), token]
        counter, held, applied, sec, usec = election.retrying(
            lambda: self._write(keys=keys, args=args), "the write"
        )
        receipt = effect_committed if applied else effect_rejected
        receipt(key, destination=DESTINATION, detail={"fence": fence}, by_destination=True)
        if self.truth is not None:
            self.truth.record(
                workflow_key=ownership.workflow_key,
                effect_key=key,
                executor=ownership.worker_id,
                epoch=ownership.owner_epoch,
                owned=int(counter) == fence,
                evidence=f"{lock.fence_key} {counter} at the write; "
                f"{lock.name} {'held by its token' if held else 'lapsed'}",
                committed=bool(applied),
                at=int(sec) + int(usec) / 1e6,
                heard=campaign_time(),  # the reply, and so the receipt, may come much later
            )
        return bool(applied)


def main() -> None:
    p = election.arguments(__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the worker's Redis (through its proxy)")
    p.add_argument("--root", required=True, help="the run's key space")
    p.add_argument("--ttl", type=float, default=2.0, help="the locks' timeout, seconds")
    election.main(
        p, lambda a: RedisLockWorker(connect(a.url), a.root, a.units, a.prefer, a.ttl, a.work_s)
    )


if __name__ == "__main__":
    main()
