"""The Kubernetes source (the slow job's: it needs the built kube-apiserver): a real API server
on its etcd (`LocalKubeApiServer`), `splitbrain watch kubernetes` on the run's Leases, and three
`kube_worker` processes electing a leader per shard with the adapter's `LeaderElector` and
writing their units' effects to ConfigMaps (see `kube_worker` for the ground truth)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, Final

from detector.devstack.kube_apiserver import (
    LocalKubeApiServer,
    kube_apiserver_binary,
)
from detector.devstack.needs import missing_package, missing_program
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.source import CampaignEnv, Fleet, RunEnv
from detector.testing.campaign.sources import _election
from detector.testing.campaign.sources._election import SHARDS, python, work_args
from detector.testing.campaign.truth import TruthLog

NAMESPACE: Final = "default"
UNITS: Final = 16  # per shard: about 10 s of work for its leader
LEASE_S: Final = 3  # kube_worker.LEASE_S (not imported here: the client loads on use)
RETRY_S: Final = 1  # how often a candidate tries: it takes an expired Lease up to this late


class KubeSession(_election.ElectionSession[LocalKubeApiServer]):
    def kubeconfig(self, env: RunEnv, name: str, port: int) -> str:
        """The server's kubeconfig with the API server at `port` (a worker's proxy)."""
        path = env.workdir / f"kubeconfig-{name}"
        text = self.server.kubeconfig.read_text()
        path.write_text(text.replace(self.server.url, f"https://127.0.0.1:{port}"))
        return str(path)

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[Fleet]:
        from kubernetes import client, config  # noqa: PLC0415

        from detector.testing.campaign.kube_worker import (  # noqa: PLC0415
            read_cursor,
            recover,
            shard_name,
        )

        name = f"c{self.nonce}-r{env.run}"
        config.load_kube_config(config_file=str(self.server.kubeconfig))  # type: ignore[no-untyped-call]
        core = client.CoreV1Api()
        names = [shard_name(name, k) for k in range(SHARDS)]
        for cm in names:
            body: Any = client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=cm), data={"cursor": "0"}
            )
            core.create_namespaced_config_map(NAMESPACE, body)

        def done() -> bool:
            return all(read_cursor(core, NAMESPACE, cm) >= UNITS for cm in names)

        def worker(i: int, port: int) -> list[str]:
            return python(
                "detector.testing.campaign.kube_worker",
                *("--kubeconfig", self.kubeconfig(env, f"w{i}", port)),
                *("--namespace", NAMESPACE, "--name", name, "--identity", f"w{i}"),
                *work_args(i, UNITS),
            )

        watcher = python(
            "detector.cli",
            *("watch", "kubernetes", "--kubeconfig", str(self.server.kubeconfig)),
            *("--namespace", NAMESPACE, *(a for n in names for a in ("--lease", n))),
            *("--topic", env.campaign.input_topic),
        )
        leases = client.CoordinationV1Api()

        def recovered(truth: TruthLog) -> int:
            """The writes whose workers were killed before recording them (`recover`)."""
            return recover(leases, NAMESPACE, truth)

        with self.fleet(env, watcher, worker, done, recovered) as fleet:
            yield fleet


class KubernetesSource(_election.ElectionSource):
    name = "kubernetes"
    holds: Mapping[Fault, tuple[float, float]] = _election.holds(LEASE_S + RETRY_S)
    # The watcher's holders carry the Lease's resourceVersion, and so do the work's effects:
    # an attempt the Lease's as it read it, a write its own from the API server's answer (the
    # destination's receipt, `LeaderElector.committed`). An attempt whose read failed has none
    # and is ordered by arrival.
    grade = Grade(ordering="per_condition", destination_confirms=True)
    blind = _election.blind(
        no_holder="a write while the Lease had no holder (its holder resigned, or its "
        "election failed and it released the Lease, while a unit it had begun was still "
        "writing; nobody had taken it yet): no later owner existed for the write to be stale "
        "against (DESIGN §4), and the watcher's lease_released fences the holder",
        attempt_unread="an attempt made while the Lease could not be read (a partition): its "
        "event carries no seq, so it is ordered by arrival, and the truth cannot place it in "
        "the API server's order either; a finding on it is neither a hit nor a false alarm",
    )

    def missing(self) -> str | None:
        if lacking := missing_package("kubernetes", "kubernetes") or missing_program(
            "kube-apiserver", kube_apiserver_binary
        ):
            return lacking
        if shutil.which("openssl") is None:
            return "the kubernetes source needs openssl (apt-get install openssl)"
        return None

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[KubeSession]:
        with LocalKubeApiServer() as server:
            yield KubeSession(server)


def source() -> KubernetesSource:
    return KubernetesSource()
