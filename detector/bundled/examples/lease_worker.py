"""A worker of the lease store, whole: it enqueues the capture of one invoice, then claims and runs
capture jobs until Ctrl-C or SIGTERM. Its tool posts the capture to a fenced destination with the
job's fence and idempotency key, so a displaced worker's capture is refused, and a repeat is
answered with the first capture's receipt. It needs the store's PostgreSQL, and nothing else:

    export SPLITBRAIN_LEASES_DSN='host=db.internal port=5432 dbname=jobs user=jobs'
    splitbrain leases migrate
    splitbrain leases destination &      # the example destination, on http://127.0.0.1:8787
    python examples/lease_worker.py http://127.0.0.1:8787 invoice-42
"""

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from typing import Any

from detector.leases import JobClass, Labels, LeaseStore, Runner, ToolCall, ToolFailed

CAPTURE = JobClass(
    name="capture",
    lease_s=90,
    heartbeat_s=10,
    missed_heartbeats=3,
    reserve_s=15,
    max_attempts=3,
    tool_timeout_s=30,
    stage_time_limit_s=300,
)


def post(url: str, call: ToolCall) -> Any:
    """POST the job's payload to `url` with the job's headers; the destination's receipt."""
    request = urllib.request.Request(
        url,
        data=json.dumps({"amount": call.payload["amount"]}).encode(),
        # X-Execution-Fence (the token), Idempotency-Key (the job's), X-Execution-Job and
        # X-Execution-Worker: what the destination checks the fence with.
        headers={**call.headers(), "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as refused:
        refused.close()
        if refused.code == 409:  # the destination refused our fence: another owner has the job
            raise ToolFailed("stale_fence", retryable=False) from None
        raise  # any other exception is a failed attempt too: retried, then failed


async def work(dsn: str, destination: str) -> None:
    async def capture(call: ToolCall) -> dict[str, Any]:
        url = f"{destination}/effects/{call.payload['entity']}"
        receipt = await asyncio.to_thread(post, url, call)
        return {"effect_id": receipt["result"]["effect_id"]}  # the result: ids, not documents

    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    # With the detector: emitter=Emitter.from_env() sends ownership_uncertain when the store is
    # silent. Without it, nothing here needs Kafka.
    worker = f"{socket.gethostname()}-{os.getpid()}"
    runner = Runner(dsn, [CAPTURE], worker, destination="example-destination")
    try:
        await runner.run("capture", capture, stop)
    finally:
        runner.close()


def main() -> None:
    dsn = os.environ.get("SPLITBRAIN_LEASES_DSN")  # the password: PGPASSWORD or ~/.pgpass
    if len(sys.argv) != 3 or not dsn:
        sys.exit(f"usage: SPLITBRAIN_LEASES_DSN=... {sys.argv[0]} DESTINATION_URL INVOICE")
    destination, invoice = sys.argv[1].rstrip("/"), sys.argv[2]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with LeaseStore(dsn, [CAPTURE]) as store:  # the producer's side, usually another program
        store.enqueue(
            "capture",
            f"payment:{invoice}:capture",  # the operation's name: enqueued twice, one job
            {"entity": invoice, "amount": 42},
            Labels(tool_class="payments", model="none", provider="acme-pay"),
        )
    asyncio.run(work(dsn, destination))


if __name__ == "__main__":
    main()
