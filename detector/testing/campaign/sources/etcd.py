"""The etcd source: a real etcd (`LocalEtcd`), `splitbrain watch etcd` on the run's shard locks,
and three `etcd_worker` processes electing a leader per shard with etcd3gw locks and writing
their units' effects to etcd through `LockOwner` (see `etcd_worker` for the ground truth)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Final

from detector.devstack.etcd import LocalEtcd, etcd_binary
from detector.devstack.needs import missing_package, missing_program
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.nemesis import Fault
from detector.testing.campaign.source import CampaignEnv, Fleet, RunEnv
from detector.testing.campaign.sources import _election
from detector.testing.campaign.sources._election import SHARDS, python, work_args

TTL_S: Final = 2  # etcd's shortest lease
UNITS: Final = 16  # per shard: about 10 s of work for its leader


class EtcdSession(_election.ElectionSession[LocalEtcd]):
    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[Fleet]:
        from etcd3gw.client import Etcd3Client  # noqa: PLC0415

        from detector.testing.campaign.etcd_worker import (  # noqa: PLC0415
            lock_name,
            read_cursor,
            recover,
        )

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
        with self.fleet(env, watcher, worker, done, lambda t: recover(client, root, t)) as fleet:
            yield fleet


class EtcdSource(_election.ElectionSource):
    name = "etcd"
    holds: Mapping[Fault, tuple[float, float]] = _election.holds(TTL_S)
    # etcd's revisions order the watcher's holders and LockOwner's attempts and writes (an
    # attempt made while etcd could not be read has none); the writes are etcd's own receipts.
    grade = Grade(ordering="per_condition", destination_confirms=True)
    blind = _election.blind(
        no_successor="a write after the lease expired but before another worker took the lock: "
        "nobody held it, so no later owner existed for the write to be stale against (DESIGN §4 "
        "finds evidence after a takeover); the watcher's lease_lost says the holder lost it",
        attempt_unread="an attempt made while etcd could not be read (a partition): its event "
        "carries no seq, so it is ordered by arrival, and the truth cannot place it in etcd's "
        "order either; a finding on it is neither a hit nor a false alarm",
    )

    def missing(self) -> str | None:
        return missing_package("etcd", "etcd3gw") or missing_program("the etcd server", etcd_binary)

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[EtcdSession]:
        with LocalEtcd() as server:
            yield EtcdSession(server)


def source() -> EtcdSource:
    return EtcdSource()
