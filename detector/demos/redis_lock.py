"""`splitbrain demo --source redis-lock`: a Redis lock holder paused past the lock's timeout
charges after another holder took the lock.

Debian's `redis-server` joins the stack. Holder A takes the lock `payments` (a redis-py `Lock`
with `lock_class=FencedLock`, timeout 2 s, fence 1) and pauses (a GC pause, a stalled VM); Redis
expires the key and holder B takes the lock (fence 2) and charges `charge/42` through the fenced
ledger. A wakes and charges `charge/42` again through a plain write, which nothing fences: the
stale commit and the duplicate charge. Only A's `extend` then tells it the lock is gone.
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from detector.demos import DemoStack

NAME: Final = "payments"
TIMEOUT_S: Final = 2.0
PAUSE_S: Final = 3.5


class RedisLockDemo:
    name = "redis-lock"

    def __init__(self) -> None:
        self._said: deque[str] = deque()
        self._thread: threading.Thread | None = None
        self._sink: Any = None
        self._say: Callable[[str], None] = print

    def missing(self) -> str | None:
        if importlib.util.find_spec("redis") is None:
            return (
                "the redis-lock demo needs Python package 'redis': "
                "pip install 'splitbrain-detector[redis-lock]'"
            )
        if shutil.which("redis-server") is None:
            return (
                "the redis-lock demo needs Debian's redis-server: "
                "apt-get install --no-install-recommends redis-server"
            )
        return None

    def start(self, stack: DemoStack) -> None:
        from detector.devstack.components import Process  # noqa: PLC0415
        from detector.devstack.process import free_port  # noqa: PLC0415
        from detector.devstack.redis import redis_argv, redis_ready, redis_server  # noqa: PLC0415

        self._say = stack.say
        port = free_port()
        url = f"redis://127.0.0.1:{port}/0"
        data = stack.logs.parent / "redis"
        data.mkdir(exist_ok=True)
        redis = stack.add(
            Process(
                "redis",
                urls={"url": url},
                log=stack.logs / "redis.log",
                argv=redis_argv(redis_server(), port, data),
                ready=lambda: redis_ready(port),
            )
        )
        stack.say(f"started redis         {url} (pid {redis.pids[0].pid})")
        self._thread = threading.Thread(
            target=self._zombie, args=(url, stack.bootstrap_servers), daemon=True
        )
        self._thread.start()

    def _zombie(self, url: str, bootstrap: str) -> None:
        import redis  # noqa: PLC0415
        from redis.exceptions import LockNotOwnedError  # noqa: PLC0415

        from detector.adapters import AdapterSink, effect_committed  # noqa: PLC0415
        from detector.adapters.redis_lock import fenced_lock_class  # noqa: PLC0415
        from detector.kafka.emit import Emitter  # noqa: PLC0415

        say = self._said.append
        self._sink = sink = AdapterSink(
            "redis-lock", publisher=lambda: Emitter({"bootstrap.servers": bootstrap})
        )
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

    def poll(self) -> None:
        while self._said:
            self._say(self._said.popleft())

    def stop(self) -> None:
        if self._sink is not None:
            self._sink.close()


def source() -> RedisLockDemo:
    return RedisLockDemo()
