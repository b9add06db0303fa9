"""A lease-store worker process with a stand-in tool, for soak tests and the local demo.

    python -m detector.devstack.lease_worker --dsn DSN --worker-id w1 --job-class '{...}' \
        [--work-s 0.1:0.5] [--destination-url http://127.0.0.1:PORT] [--until-idle-s 3]

The tool waits a random time in `--work-s`, then, given a destination, sends the effect
(`POST /effects/<payload.entity>`) with the fence and the idempotency key as headers. Each
execution is one JSON line on stdout; logs go to stderr. SIGTERM ends it after the current job.
A worker stopped by SIGSTOP and continued is exactly what a stalled worker is: the soak test
pauses these processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import urllib.error
import urllib.request
from typing import Any

from detector.leases.errors import StoreUnavailableError
from detector.leases.policy import JobClass
from detector.leases.runner import Runner, ToolCall, ToolFailed


def _work(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m detector.devstack.lease_worker")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("SPLITBRAIN_LEASES_DSN"),
        help="the lease store (default: SPLITBRAIN_LEASES_DSN, which keeps it out of ps)",
    )
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--job-class", required=True, type=JobClass.model_validate_json)
    parser.add_argument("--work-s", type=_work, default=(0.1, 0.5), metavar="MIN:MAX")
    parser.add_argument("--destination-url")
    parser.add_argument("--until-idle-s", type=float, help="exit after this long with no job")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("no database given: pass --dsn or set SPLITBRAIN_LEASES_DSN")
    return args


class StandInTool:
    """Waits, then commits the effect at the destination (if any) under the call's fence."""

    def __init__(self, work_s: tuple[float, float], url: str | None, rng: random.Random) -> None:
        self._work_s = work_s
        self._url = url
        self._rng = rng

    async def __call__(self, call: ToolCall) -> Any:
        await asyncio.sleep(self._rng.uniform(*self._work_s))
        if self._url is None:
            return {"worked": True}
        return await asyncio.to_thread(send_effect, self._url, call)


def send_effect(url: str, call: ToolCall, timeout_s: float = 10.0) -> Any:
    """POST the call's effect to the destination at `url` (`/effects/<payload.entity>`) with the
    fence and the idempotency key as headers; the receipt, or `ToolFailed("http_<status>")`
    (retryable for a 5xx) when the destination refuses it."""
    entity = str((call.payload or {}).get("entity", call.job_id))
    request = urllib.request.Request(
        f"{url}/effects/{entity}",
        data=json.dumps({"job": str(call.job_id)}).encode(),
        headers={**call.headers(), "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise ToolFailed(f"http_{exc.code}", retryable=exc.code >= 500) from None


async def _main(args: argparse.Namespace) -> None:
    job_class: JobClass = args.job_class
    runner = Runner(args.dsn, [job_class], args.worker_id)
    tool = StandInTool(args.work_s, args.destination_url, random.Random(args.seed))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    idle_since: float | None = None
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            try:
                execution = await runner.run_one(job_class.name, tool)
            except StoreUnavailableError as exc:
                logging.getLogger(__name__).warning("claim failed: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if execution is not None:
                idle_since = None
                print(
                    json.dumps(
                        {
                            "job": str(execution.job_id),
                            "token": execution.fencing_token,
                            "status": execution.status,
                            "reason": execution.reason,
                        }
                    ),
                    flush=True,
                )
                continue
            idle_since = idle_since if idle_since is not None else loop.time()
            if args.until_idle_s is not None and loop.time() - idle_since > args.until_idle_s:
                return
            await asyncio.sleep(0.1)
    finally:
        runner.close()


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format=f"{args.worker_id} %(name)s %(message)s"
    )
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
