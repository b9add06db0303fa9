"""What several demos share, written once so that their narration and checks cannot drift apart:
the demo named on the line that says what is missing, Redis as a stack process, a log read as
it grows, and a zombie run on a thread of this process with its own adapter sink."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detector.demos import DemoStack

if TYPE_CHECKING:
    from detector.adapters import AdapterSink


def lacks(demo: str, missing: str | None) -> str | None:
    """What `missing()` says: a line of `detector.devstack.needs` said of the demo; None for
    None."""
    return None if missing is None else f"the {demo} demo {missing}"


def start_redis(stack: DemoStack) -> str:
    """Redis on a free loopback port, ready, its data beside the logs; narrated with its URL and
    PID. Returns the URL."""
    from detector.devstack.components import Process  # noqa: PLC0415
    from detector.devstack.process import free_port  # noqa: PLC0415
    from detector.devstack.redis import redis_argv, redis_ready, redis_server  # noqa: PLC0415

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
    return url


def start_program(
    stack: DemoStack,
    name: str,
    argv: list[str],
    ready: str | None,
    env: Mapping[str, str] | None = None,
    **process: Any,
) -> tuple[Path, int]:
    """A program of the demo as a stack process (with the stack's environment unless `env`),
    its output in `NAME.log`, ready once `ready` shows there (None: once it runs); `process`
    is the rest of its `Process` settings. Returns its log and its PID, for the narration."""
    from detector.devstack.components import Process  # noqa: PLC0415

    log = stack.logs / f"{name}.log"
    started = stack.add(
        Process(
            name,
            log=log,
            argv=argv,
            env=dict(stack.env if env is None else env),
            ready=None if ready is None else lambda: ready in log_text(log),
            **process,
        )
    )
    return log, started.pids[0].pid


def log_text(path: Path) -> str:
    """A process's log so far; empty before it exists."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class LogTail:
    """A log read as it grows, a whole line at a time: a line still being written waits for
    the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read = 0

    def lines(self) -> list[str]:
        """The complete lines written since the last call."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._read)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk.rpartition(b"\n")[0]
        if not complete:
            return []
        self._read += len(complete) + 1
        return complete.decode(errors="replace").splitlines()


class ThreadedDemo:
    """A source whose zombie runs on a daemon thread of this process and emits through its own
    `AdapterSink`: the thread queues its narration and `poll` says it on the demo's thread."""

    def __init__(self) -> None:
        self._said: deque[str] = deque()
        self._thread: threading.Thread | None = None
        self._sink: AdapterSink | None = None
        self._say: Callable[[str], None] = print

    def _run(self, stack: DemoStack, zombie: Callable[..., None], *args: Any) -> None:
        """Narrate through `stack` and start `zombie(*args)` on the thread."""
        self._say = stack.say
        self._thread = threading.Thread(target=zombie, args=args, daemon=True)
        self._thread.start()

    def _open_sink(self, source: str, bootstrap: str) -> AdapterSink:
        """The zombie's sink, publishing to the stack's broker; closed by `stop`."""
        from detector.adapters import AdapterSink  # noqa: PLC0415
        from detector.kafka.emit import Emitter  # noqa: PLC0415

        self._sink = AdapterSink(
            source, publisher=lambda: Emitter({"bootstrap.servers": bootstrap})
        )
        return self._sink

    def poll(self) -> None:
        while self._said:
            self._say(self._said.popleft())

    def stop(self) -> None:
        if self._sink is not None:
            self._sink.close()
