"""`splitbrain demo --source redis-lock`: a Redis lock holder paused past the lock's timeout
charges after another holder took the lock.

Debian's `redis-server` joins the stack. Holder A takes the lock `payments` (a redis-py `Lock`
with `lock_class=FencedLock`, timeout 2 s, fence 1) and pauses (a GC pause, a stalled VM); Redis
expires the key and holder B takes the lock (fence 2) and charges `charge/42` through the fenced
ledger. A wakes and charges `charge/42` again through a plain write, which nothing fences: the
stale commit and the duplicate charge. Only A's `extend` then tells it the lock is gone.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from detector.demos import DemoStack
from detector.demos._common import ThreadedDemo, lacks, start_redis
from detector.devstack.needs import missing_package, missing_redis_server

NAME: Final = "payments"
TIMEOUT_S: Final = 2.0
PAUSE_S: Final = 3.5


class RedisLockDemo(ThreadedDemo):
    name = "redis-lock"

    def missing(self) -> str | None:
        return lacks(self.name, missing_package("redis-lock", "redis") or missing_redis_server())

    def start(self, stack: DemoStack) -> None:
        self._run(stack, self._zombie, start_redis(stack), stack.bootstrap_servers)

    def _zombie(self, url: str, bootstrap: str) -> None:
        import redis  # noqa: PLC0415
        from redis.exceptions import LockNotOwnedError  # noqa: PLC0415

        from detector.adapters import effect_committed  # noqa: PLC0415
        from detector.adapters.redis_lock import fenced_lock_class  # noqa: PLC0415

        say = self._said.append
        sink = self._open_sink("redis-lock", bootstrap)
        client = redis.Redis.from_url(url)
        a = client.lock(NAME, timeout=TIMEOUT_S, lock_class=fenced_lock_class(sink, worker_id="A"))
        b = client.lock(NAME, timeout=30, lock_class=fenced_lock_class(sink, worker_id="B"))
        taken = threading.Event()

        def holder_b() -> None:
            if not b.acquire(blocking_timeout=30):
                say("holder B could not take the lock")
                return
            say(f"holder B took the lock {NAME} (fence {b.fence}) after A's key expired")
            b.fenced_set("ledger/charge-42", "paid by B", effect_key="charge/42")
            say("holder B charged charge/42 through the fenced ledger")
            taken.set()
            b.release()

        if not a.acquire(blocking_timeout=10):
            say("holder A could not take the lock")
            return
        say(f"holder A took the lock {NAME} (fence {a.fence}, timeout {TIMEOUT_S:g}s); it pauses")
        time.sleep(PAUSE_S)  # A's pause: it does not extend, Redis expires its key
        other = threading.Thread(target=holder_b, daemon=True)
        other.start()
        taken.wait(30)
        other.join(30)
        # A wakes and goes on as if it held the lock: a plain write, which nothing fences.
        client.set("ledger/charge-42", "paid by A")
        effect_committed("charge/42", destination="ledger")
        say("holder A woke up and charged charge/42 again, unfenced: Redis applied it")
        try:
            a.extend(TIMEOUT_S)
        except LockNotOwnedError:
            say("holder A's extend raised LockNotOwnedError: only now does it know")
        sink.flush(30)
        client.close()


def source() -> RedisLockDemo:
    return RedisLockDemo()
