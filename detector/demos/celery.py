"""`splitbrain demo --source celery`: an `acks_late` task redelivered past Redis's visibility
timeout sends one email twice.

Debian's `redis-server` and two Celery workers (`detector.demos.celery_app`, with the adapter
installed) join the stack; one task is sent. The worker that gets it works past the 3 s
visibility timeout; the Redis transport hands the message to the other worker, which sends the
email; then the first one sends it too.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from detector.demos import DemoStack
from detector.demos._common import (
    LogTail,
    lacks,
    log_text,
    start_program,
    start_redis,
)
from detector.devstack.needs import missing_package, missing_redis_server

if TYPE_CHECKING:
    from celery import Celery

ADDRESS: Final = "a@example.com"
WORKERS: Final = 2
# The first delivery's work: twice the visibility timeout.
FIRST_S: Final = "6"
SAY: Final = "splitbrain-demo:"  # detector.demos.celery_app's lines in the worker's log
RECEIVED: Final = "Task send_welcome_email["  # Celery's "Task NAME[ID] received" line
READY: Final = " ready."  # Celery's "NAME ready." line, once the worker consumes
# detector.demos.celery_app's settings
BROKER_ENV: Final = "ZOMBIE_CELERY_BROKER"
TOPIC_ENV: Final = "ZOMBIE_CELERY_TOPIC"
FIRST_ENV: Final = "ZOMBIE_CELERY_FIRST_S"
VISIBILITY_S: Final = 3.0


def configure(app: Celery) -> None:
    """`acks_late` on Redis with a visibility timeout of `VISIBILITY_S` and a restore scan every
    second (by default only every ~100 s): the settings under which a slow delivery is handed to
    another worker while it still runs (the demo's app and the campaign's share them)."""
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": VISIBILITY_S,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )


def worker_argv(n: int, app: str = "detector.demos.celery_app") -> list[str]:
    """Worker `n` of `app` (a module): prefork, one process, named workerN@host."""
    return [
        *(sys.executable, "-m", "celery", "-A", app, "worker"),
        *("-n", f"worker{n}@%h", "--concurrency", "1", "--loglevel", "INFO"),
        *("--without-gossip", "--without-mingle"),
    ]


class CeleryDemo:
    name = "celery"

    def __init__(self) -> None:
        self._logs: dict[str, LogTail] = {}
        self._client: Any = None
        self._say: Callable[[str], None] = print

    def missing(self) -> str | None:
        return lacks(
            self.name, missing_package("celery", "celery", "redis") or missing_redis_server()
        )

    def start(self, stack: DemoStack) -> None:
        from celery import Celery  # noqa: PLC0415

        from detector.demos.celery_app import TASK  # noqa: PLC0415

        self._say = stack.say
        url = start_redis(stack)
        env = {**stack.env, BROKER_ENV: url, FIRST_ENV: FIRST_S}
        for n in range(1, WORKERS + 1):
            name = f"celery-{n}"
            log, pid = start_program(stack, name, worker_argv(n), READY, env, stop_timeout=10.0)
            self._logs[name] = LogTail(log)
            stack.say(f"started {name:<13} a Celery worker, prefork, 1 process (pid {pid})")
        self._client = Celery("splitbrain-demo", broker=url)
        task_id = str(uuid.uuid4())
        self._client.send_task(TASK, args=[ADDRESS], task_id=task_id)
        stack.say(
            f"sent task {TASK}({ADDRESS}) id {task_id}: acks_late, visibility timeout 3s; "
            f"the first delivery works {FIRST_S}s before it sends"
        )

    def poll(self) -> None:
        for name, log in self._logs.items():
            for line in log.lines():
                if SAY in line:
                    self._say(f"{name}: {line.partition(SAY)[2].strip()}")
                elif RECEIVED in line and line.rstrip().endswith("received"):
                    self._say(f"{name}: received the task")

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def says(log: Path, text: str) -> bool:
    """`text` is in the log (False while there is no log)."""
    return text in log_text(log)


def source() -> CeleryDemo:
    return CeleryDemo()
