"""A real kube-apiserver on loopback, for the Kubernetes adapter's slow test and demo.

No Kubernetes server is packaged for Debian or PyPI: `build-kube-apiserver.sh`, shipped beside
this module (and run by `python -m detector.devstack.kube_apiserver`, from a checkout or an
installed wheel alike), builds one from the Go module proxy into `~/.cache/splitbrain/`. It
runs against a `LocalEtcd`, with what a Lease needs and nothing more: a static token (user in
`system:masters`), every request allowed, service-account keys from `openssl genrsa` (the server
will not start without them), the ServiceAccount admission plugin off (no controller manager
makes the default account).
"""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

from detector.devstack.etcd import LocalEtcd
from detector.devstack.process import ChildServer, came_up, last_lines, spawn
from detector.errors import SplitbrainError

# Package data: in a wheel as in a checkout (`scripts/build-kube-apiserver.sh` runs this one).
BUILD_SCRIPT: Final = Path(__file__).resolve().with_name("build-kube-apiserver.sh")
BUILD_COMMAND: Final = "python -m detector.devstack.kube_apiserver"
TOKEN: Final = "splitbrain-test-token"


class LocalKubeApiServerError(SplitbrainError, RuntimeError):
    """The binary is not built, or the server did not become ready."""


def kube_apiserver_binary() -> Path:
    """The binary the build script caches; raises with the command that builds it."""
    try:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise LocalKubeApiServerError(
            f"kube-apiserver: cannot run {BUILD_SCRIPT.name} ({type(exc).__name__})"
        ) from exc
    path = Path(out)
    if not path.is_file():
        raise LocalKubeApiServerError(
            f"kube-apiserver is not built: run `{BUILD_COMMAND}` (the packaged "
            f"{BUILD_SCRIPT.name}: Go, about 15 min), which writes {path}"
        )
    return path


def build() -> int:
    """Build the server (the packaged script; cached: a second run returns at once)."""
    return subprocess.run(["bash", str(BUILD_SCRIPT)], check=False).returncode


class LocalKubeApiServer(ChildServer):
    """kube-apiserver and its etcd: `.url`, `.kubeconfig` (a file with the token)."""

    def __init__(self, *, etcd: LocalEtcd | None = None, start_timeout: float = 120.0) -> None:
        """`etcd`: one the caller runs; by default the server starts and stops its own."""
        self._binary = kube_apiserver_binary()
        super().__init__("splitbrain-kube-", start_timeout)
        self._own_etcd = etcd is None
        self._etcd = LocalEtcd() if etcd is None else etcd

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self._root / "kubeconfig"

    @property
    def log_path(self) -> Path:
        return self._root / "kube-apiserver.log"

    def prepare(self) -> list[str]:
        """Write the keys, the token file and the kubeconfig; the server's command line."""
        key, pub = self._root / "sa.key", self._root / "sa.pub"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
            check=True,
            capture_output=True,
        )
        tokens = self._root / "tokens.csv"
        tokens.write_text(f'{TOKEN},splitbrain,1,"system:masters"\n')
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: local\n  cluster:\n    server: {self.url}\n"
            "    insecure-skip-tls-verify: true\n"
            f"users:\n- name: splitbrain\n  user:\n    token: {TOKEN}\n"
            "contexts:\n- name: local\n  context:\n    cluster: local\n    user: splitbrain\n"
            "current-context: local\n"
        )
        return [
            str(self._binary),
            f"--etcd-servers={self._etcd.endpoint}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self._root / 'certs'}",
            "--authorization-mode=AlwaysAllow",
            f"--token-auth-file={tokens}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pub}",
            f"--service-account-signing-key-file={key}",
            "--disable-admission-plugins=ServiceAccount",
            "--service-cluster-ip-range=10.0.0.0/24",
        ]

    def start(self) -> None:
        if self._own_etcd:
            self._etcd.start()
        self._proc = spawn(self.prepare(), self.log_path)
        if not came_up(self._proc, self.ready, self.start_timeout, 0.5):
            self.stop()
            raise LocalKubeApiServerError(f"kube-apiserver did not start:\n{self.log_tail()}")

    def ready(self) -> bool:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        if self._own_etcd:
            self._etcd.stop()

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._own_etcd:
                self._etcd.close()

    def log_tail(self, lines: int = 30) -> str:
        return last_lines(self.log_path, lines, "(no kube-apiserver log yet)")


if __name__ == "__main__":
    raise SystemExit(build())
