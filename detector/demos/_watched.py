"""What the etcd and Kubernetes demos share: an etcd server in the stack and a `splitbrain watch`
process following it (the Kubernetes demo's API server stores its Leases in that etcd).

Both are stack processes: recorded, waited for until ready, stopped with the rest; etcd's
throwaway directory is recorded as the component's `root`, so stopping the stack removes it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from detector.demos import DemoStack
from detector.demos._common import start_program

if TYPE_CHECKING:
    from detector.devstack.etcd import LocalEtcd


def start_etcd(stack: DemoStack) -> LocalEtcd:
    """etcd on a free loopback port, ready; narrated with its endpoint and PID."""
    from detector.devstack.components import Process  # noqa: PLC0415
    from detector.devstack.etcd import LocalEtcd  # noqa: PLC0415

    etcd = LocalEtcd()
    server = stack.add(
        Process(
            "etcd",
            urls={"client": etcd.endpoint},
            log=stack.logs / "etcd.log",
            data={"root": str(etcd.root)},
            argv=etcd.argv(),
            ready=etcd.healthy,
        )
    )
    stack.say(f"started etcd          {etcd.endpoint} (pid {server.pids[0].pid})")
    return etcd


def start_watcher(stack: DemoStack, system: str, *args: str, shown: str) -> None:
    """`splitbrain watch SYSTEM ARGS...`, ready once it logs that it follows; narrated with
    `shown` (the arguments a reader needs)."""
    name = f"watch-{system}"
    argv = [sys.executable, "-m", "detector.cli", "watch", system, *args]
    _, pid = start_program(stack, name, argv, "following")
    stack.say(f"started {name:<13} splitbrain watch {system} {shown} (pid {pid})")
