"""`splitbrain demo --source etcd`: a lock holder paused past its lease's TTL writes after
another process took the lock.

etcd (3.5.1, from the `etcd-server` extra) and `splitbrain watch etcd` join the stack. Holder A
takes `/locks/payments` with a 2 s lease, charges once, then stops refreshing (a GC pause, a
stalled VM); etcd expires the lease and holder B takes the lock; A wakes and charges again, an
unfenced write that etcd applies. The watcher reports both acquisitions at etcd's revisions, and
A's write carries its revision: the detector orders them by etcd's own clock.
"""

from __future__ import annotations

import time
from typing import Final

from detector.demos import DemoStack
from detector.demos._common import ThreadedDemo, lacks
from detector.demos._watched import start_etcd, start_watcher
from detector.devstack.needs import missing_package, missing_program

UNIT: Final = "/locks/payments"
TTL_S: Final = 2
PAUSE_S: Final = 4.5


class EtcdDemo(ThreadedDemo):
    name = "etcd"

    def missing(self) -> str | None:
        from detector.devstack.etcd import etcd_binary  # noqa: PLC0415

        return lacks(
            self.name,
            missing_package("etcd", "etcd3gw") or missing_program("the etcd server", etcd_binary),
        )

    def start(self, stack: DemoStack) -> None:
        etcd = start_etcd(stack)
        start_watcher(
            stack,
            "etcd",
            *("--endpoints", etcd.endpoint, "--prefix", UNIT),
            *("--state-file", str(stack.logs.parent / "watch-etcd.json")),
            shown=f"--prefix {UNIT}",
        )
        self._run(stack, self._zombie, etcd.port, stack.bootstrap_servers)

    def _zombie(self, port: int, bootstrap: str) -> None:
        from etcd3gw.client import Etcd3Client  # noqa: PLC0415

        from detector.adapters.etcd import LockOwner  # noqa: PLC0415

        say = self._said.append
        sink = self._open_sink("etcd", bootstrap)
        client = Etcd3Client(host="127.0.0.1", port=port)
        a = client.lock("payments", ttl=TTL_S)
        if not a.acquire():
            say("holder A could not take the lock")
            return
        with LockOwner.of_lock(client, a, sink) as holder:
            epoch = holder.ownership.owner_epoch if holder.ownership else None
            say(f"holder A took {UNIT} (create_revision {epoch}, lease {TTL_S}s)")
            holder.put("/ledger/batch-7", "opened by A", effect_key="batch-7/opened")
            say("holder A opened batch-7 through a fenced write; now it pauses")
            time.sleep(PAUSE_S)  # A does not refresh: the lease expires meanwhile
            b = client.lock("payments", ttl=30)
            while not b.acquire():
                time.sleep(0.2)
            b_epoch = client.get(UNIT, metadata=True)[0][1]["create_revision"]
            say(f"holder B took {UNIT} (create_revision {b_epoch}) after A's lease expired")
            holder.put("/ledger/charge-42", "A again", effect_key="charge/42", fenced=False)
            say("holder A woke up and charged charge/42 again, unfenced: etcd applied it")
        sink.flush(30)


def source() -> EtcdDemo:
    return EtcdDemo()
