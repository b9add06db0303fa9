"""The etcd source: a real etcd (`LocalEtcd`), `splitbrain watch etcd` on the run's shard locks,
and three `etcd_worker` processes electing a leader per shard with etcd3gw locks and writing
their units' effects to etcd through `LockOwner` (see `etcd_worker` for the ground truth)."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from detector.testing.campaign.checker import Grade
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.source import CampaignEnv, Fleet, RunEnv
from detector.testing.campaign.sources import _election
from detector.testing.campaign.sources._election import SHARDS, python, work_args

TTL_S: Final = 2  # etcd's shortest lease
UNITS: Final = 16  # per shard: about 10 s of work for its leader

BLIND: Final = {
    "no_successor": "a write after the lease expired but before another worker took the lock: "
    "nobody held it, so no later owner existed for the write to be stale against (DESIGN §4 "
    "finds evidence after a takeover); the watcher's lease_lost says the holder lost it",
}


@dataclass
class EtcdSession:
    env: CampaignEnv
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        from detector.devstack.etcd import LocalEtcd  # noqa: PLC0415

        self.server = LocalEtcd()
        self.nonce = uuid.uuid4().hex[:8]

    def restart(self, down_s: float) -> None:
        """The coordinator restart: etcd stopped, then started again on its data directory."""
        with self._lock:
            self.server.stop()
            time.sleep(down_s)
            self.server.start()

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[Fleet]:
        from etcd3gw.client import Etcd3Client  # noqa: PLC0415

        from detector.testing.campaign.etcd_worker import lock_name, read_cursor  # noqa: PLC0415

        root = f"campaign/{self.nonce}/r{env.run}"
        client = Etcd3Client(host="127.0.0.1", port=self.server.port, timeout=5)

        def done() -> bool:
            return all(read_cursor(client, root, k) >= UNITS for k in range(SHARDS))

        def worker(i: int, port: int) -> list[str]:
            return python(
                "detector.testing.campaign.etcd_worker",
                *("--endpoint", f"http://127.0.0.1:{port}", "--root", root),
                *("--ttl", str(TTL_S), *work_args(i, UNITS)),
            )

        prefixes = [a for k in range(SHARDS) for a in ("--prefix", f"/locks/{lock_name(root, k)}")]
        watcher = python(
            "detector.cli",
            *("watch", "etcd", "--endpoints", self.server.endpoint, *prefixes),
            *("--topic", env.campaign.input_topic),
        )
        with _election.fleet(
            env,
            watcher_argv=watcher,
            worker_argv=worker,
            port=self.server.port,
            done=done,
            restart_coordinator=self.restart,
        ) as fleet:
            yield fleet


class EtcdSource:
    name = "etcd"
    faults = _election.FAULTS
    holds: Mapping[Fault, tuple[float, float]] = {
        Fault.PAUSE_PAST_LEASE: (TTL_S + 2.0, TTL_S + 5.0),
        Fault.CRASH_RESTART: (1.0, 4.0),
        Fault.GRACEFUL_SHUTDOWN: (0.5, 2.0),
        Fault.PARTITION: (1.0, TTL_S + 4.0),  # shorter than the lease, or past it
        Fault.HANDOFF: (0.0, 0.0),
        Fault.EXCEPTION_RETRY: (0.0, 0.0),
        Fault.COORDINATOR_RESTART: (0.5, 2.0),
        Fault.CLOCK_STEP: (-3.0, 3.0),  # hours
    }
    workers = _election.WORKERS
    span_s = 8.0
    steps = 3
    # etcd's revisions order the watcher's holders and LockOwner's writes; the writes are etcd's
    # own receipts.
    grade = Grade(ordering="authoritative_seq", destination_confirms=True)
    blind = BLIND

    def missing(self) -> str | None:
        if importlib.util.find_spec("etcd3gw") is None:
            return "the etcd source needs etcd3gw: pip install 'splitbrain-detector[etcd]'"
        from detector.devstack.etcd import LocalEtcdError, etcd_binary  # noqa: PLC0415

        try:
            etcd_binary()
        except LocalEtcdError as exc:
            return str(exc)
        return None

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[EtcdSession]:
        session = EtcdSession(env)
        with session.server:
            yield session


def source() -> EtcdSource:
    return EtcdSource()
