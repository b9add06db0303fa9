"""`splitbrain demo --source kubernetes`: a leader paused past its Lease goes on working after
the other candidate took over.

etcd, a real kube-apiserver (built by `python -m detector.devstack.kube_apiserver`), `splitbrain
watch kubernetes` and two Python leader-election candidates (`detector.demos.kube_candidate`, with
`LeaderElector`) join the stack; each reports an effect every 0.3 s while it leads. The leader
is paused (SIGSTOP) past its 4 s lease; the other takes the Lease; the paused one resumes and
works on until its elector notices, when `LeaderElector` stops its work.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from detector.contracts.topics import INPUT_TOPIC
from detector.demos import DemoStack
from detector.demos._common import lacks, log_text, start_program
from detector.demos._watched import start_etcd, start_watcher
from detector.devstack.needs import missing_package, missing_program

NAMESPACE: Final = "default"
LEASE: Final = "payments-leader"
CANDIDATES: Final = ("pod-a", "pod-b")
PAUSE_S: Final = 6.0


class KubernetesDemo:
    name = "kubernetes"

    def __init__(self) -> None:
        self._logs: dict[str, Path] = {}
        self._pids: dict[str, int] = {}
        self._leader: str | None = None
        self._paused_at: float | None = None
        self._resumed = False
        self._told: set[str] = set()
        self._say: Callable[[str], None] = print

    def missing(self) -> str | None:
        from detector.devstack.etcd import etcd_binary  # noqa: PLC0415
        from detector.devstack.kube_apiserver import kube_apiserver_binary  # noqa: PLC0415

        if lacking := (
            missing_package("kubernetes", "kubernetes")
            or missing_program("etcd", etcd_binary)
            or missing_program("kube-apiserver", kube_apiserver_binary)
        ):
            return lacks(self.name, lacking)
        if shutil.which("openssl") is None:
            return "the kubernetes demo needs openssl (apt-get install openssl)"
        return None

    def start(self, stack: DemoStack) -> None:
        from detector.devstack.components import Process  # noqa: PLC0415
        from detector.devstack.kube_apiserver import LocalKubeApiServer  # noqa: PLC0415

        self._say = stack.say
        server = LocalKubeApiServer(etcd=start_etcd(stack))
        api = stack.add(
            Process(
                "kube-apiserver",
                urls={"api": server.url},
                log=stack.logs / "kube-apiserver.log",
                data={"root": str(server.root)},  # its keys, certificates and kubeconfig
                argv=server.prepare(),
                ready=server.ready,
                stop_timeout=20.0,
            )
        )
        stack.say(f"started kube-apiserver {server.url} (pid {api.pids[0].pid})")
        kube = ("--kubeconfig", str(server.kubeconfig), "--namespace", NAMESPACE)
        start_watcher(stack, "kubernetes", *kube, "--lease", LEASE, shown=f"--lease {LEASE}")
        for identity in CANDIDATES:
            argv = [
                *(sys.executable, "-m", "detector.demos.kube_candidate"),
                *kube,
                *("--lease", LEASE, "--identity", identity),
                *("--topic", INPUT_TOPIC),
            ]
            self._logs[identity], self._pids[identity] = start_program(stack, identity, argv, None)
            stack.say(f"started {identity:<13} a Python LeaderElection candidate, lease 4s")

    def poll(self) -> None:
        texts = {identity: log_text(log) for identity, log in self._logs.items()}
        if self._leader is None:
            for identity, text in texts.items():
                if "effect 3 " in text:
                    self._leader = identity
                    os.kill(self._pids[identity], signal.SIGSTOP)
                    self._paused_at = time.monotonic()
                    self._say(f"{identity} leads and works; pausing it (SIGSTOP) past its lease")
            return
        other = next(c for c in CANDIDATES if c != self._leader)
        if "effect 1 " in texts[other] and "took" not in self._told:
            self._told.add("took")
            self._say(f"{other} took the Lease and works")
        if (
            not self._resumed
            and self._paused_at is not None
            and time.monotonic() - self._paused_at > PAUSE_S
        ):
            self._resumed = True
            os.kill(self._pids[self._leader], signal.SIGCONT)
            self._say(f"{self._leader} resumes (SIGCONT): it still believes it leads")
        if "stopped leading" in texts[self._leader] and "stopped" not in self._told:
            self._told.add("stopped")
            self._say(f"{self._leader}: stopped leading; LeaderElector stopped its work")

    def stop(self) -> None:
        if self._leader is not None and not self._resumed:
            with contextlib.suppress(ProcessLookupError):  # so that it can be stopped
                os.kill(self._pids[self._leader], signal.SIGCONT)


def source() -> KubernetesDemo:
    return KubernetesDemo()
