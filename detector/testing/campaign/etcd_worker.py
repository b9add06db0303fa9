"""A campaign worker on etcd: `python -m detector.testing.campaign.etcd_worker --endpoint URL
--root R --shards N --units U --prefer K --ttl S` (Kafka, topic and truth log from the
environment the campaign gives it).

Each shard is an etcd3gw `Lock` (`/locks/R/shard-K`, a lease of `--ttl` seconds kept alive by a
thread of its own); its leader works under `LockOwner`: `effect_attempted`, the unit's work, the
write to the ledger key `R/ledger/shard-K/unit-I` through `LockOwner.put` (fenced or not, per
`election.fenced`), then the cursor `R/cursor/shard-K` moved on by a fenced transaction.

The ground truth of each write is the lock key as etcd held it at the write's own revision (an
MVCC read at that revision): the executor owned the shard iff the key then had the
`create_revision` it won with.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Final
from urllib.parse import urlsplit

from etcd3gw.client import Etcd3Client
from etcd3gw.lock import Lock
from etcd3gw.utils import _decode, _encode

from detector.adapters import current
from detector.adapters.etcd import LockOwner
from detector.testing.campaign import election
from detector.testing.campaign.truth import PROCESS_ENV, TruthLog, campaign_time, owner_of
from detector.testing.campaign.worker import sink

log = logging.getLogger("campaign.etcd")

# Set on a write the detector cannot show by design: the lease expired and nobody held the lock
# yet, so no later owner exists for the write to be stale against.
NO_SUCCESSOR: Final = "no_successor"
# Set on an attempt made while etcd could not be read: its event carries no seq (ordered by
# arrival), and the truth cannot place it in etcd's order either.
UNREAD: Final = "attempt_unread"


def lock_name(root: str, shard: int) -> str:
    """The etcd3gw lock of a shard (its key is `/locks/` + this)."""
    return f"{root}/shard-{shard}"


def cursor_key(root: str, shard: int) -> str:
    return f"/{root}/cursor/shard-{shard}"


def read_cursor(client: Etcd3Client, root: str, shard: int) -> int:
    found = client.get(cursor_key(root, shard))
    return int(found[0]) if found else 0


def lock_at(client: Etcd3Client, key: str, revision: int) -> dict[str, Any] | None:
    """The lock key as etcd held it at `revision` (None: absent)."""
    doc = client.post(client.get_url("/kv/range"), json={"key": _encode(key), "revision": revision})
    kvs = doc.get("kvs") or []
    return dict(kvs[0]) if kvs else None


def ledger_prefix(root: str) -> str:
    return f"/{root}/ledger/"


def judged(
    client: Etcd3Client, lock_key: str, revision: int | None, epoch: int
) -> tuple[bool, str, str | None]:
    """(owned, evidence, blind) of an effect of `epoch` made at `revision`: whether the lock key
    then still had the `create_revision` the executor won with."""
    if revision is None:  # only an attempt: a write's answer always carries one
        return False, f"{lock_key}: etcd could not be read at the attempt", UNREAD
    held = election.retrying(lambda: lock_at(client, lock_key, revision), "reading the lock")
    if held is None:
        return False, f"{lock_key} at revision {revision}: absent", NO_SUCCESSOR
    create = int(held["create_revision"])
    said = f"create_revision {create}, lease {int(held.get('lease', 0)):x}"
    return create == epoch, f"{lock_key} at revision {revision}: {said}", None


def recover(client: Etcd3Client, root: str, truth: TruthLog) -> int:
    """Record the writes etcd made whose writer died before it recorded them (a SIGKILL between
    the write and its record); how many. Each is read back from its ledger key, at the revision
    etcd made it."""
    recorded = {(w.effect_key, w.executor) for w in truth.writes() if w.committed}
    prefix = ledger_prefix(root)
    doc = election.retrying(
        lambda: client.post(
            client.get_url("/kv/range"),
            json={"key": _encode(prefix), "range_end": _encode(prefix[:-1] + "0")},
        ),
        "reading the ledger",
    )
    found = 0
    for kv in doc.get("kvs") or []:
        effect_key, executor = _decode(kv["key"]).decode()[len(prefix) :].rsplit("/", 1)
        made = json.loads(_decode(kv["value"]))
        if (effect_key, executor) in recorded or made["epoch"] is None:
            continue
        lock_key = f"/locks/{root}/{effect_key.split('/')[0]}"
        owned, evidence, blind = judged(client, lock_key, int(kv["mod_revision"]), made["epoch"])
        TruthLog(truth.path, truth.run, made["process"]).record(
            workflow_key=lock_key,
            effect_key=effect_key,
            executor=executor,
            epoch=made["epoch"],
            owned=owned,
            evidence=f"{evidence} (recovered from etcd: its writer died before recording it)",
            at=made["at"],
            blind=blind,
        )
        found += 1
    return found


class EtcdWorker:
    def __init__(self, endpoint: str, root: str, units: int, prefer: int, ttl: int, work_s: float):
        url = urlsplit(endpoint)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 2379
        self.root = root
        self.units = units
        self.prefer = prefer
        self.ttl = ttl
        self.work_s = work_s
        self.orders = election.Orders()
        self.sink = sink("etcd")
        self.truth = TruthLog.from_env()
        self.process = os.environ.get(PROCESS_ENV)

    def client(self) -> Etcd3Client:
        """One per thread: a requests session is not shared between threads."""
        return Etcd3Client(host=self.host, port=self.port, timeout=5)

    def run_shard(self, shard: int) -> None:
        client = self.client()
        name = lock_name(self.root, shard)
        self.orders.wait_for_the_preferred(shard == self.prefer)
        while not self.orders.stopping.is_set():
            try:
                done = read_cursor(client, self.root, shard) >= self.units
                lock = None if done or self.orders.sitting_out() else client.lock(name, self.ttl)
                won = lock is not None and lock.acquire()
            except Exception as exc:
                log.info("%s: etcd unreachable (%s)", name, type(exc).__name__)
                won, lock = False, None
            if won and lock is not None:
                self.lead(client, lock, shard)
            else:
                self.orders.wait_to_try(shard == self.prefer)

    def lead(self, client: Etcd3Client, lock: Lock, shard: int) -> None:
        since = self.orders.began()
        try:
            self.lead_since(client, lock, shard, since)
        finally:
            self.orders.ended()

    def lead_since(self, client: Etcd3Client, lock: Lock, shard: int, since: float) -> None:
        lost = threading.Event()
        with LockOwner.of_lock(client, lock, self.sink) as owner:
            if owner.ownership is None:  # the lease expired before the work began
                return
            log.info("leading %s (create_revision %d)", lock.key, owner.ownership.owner_epoch)
            beat = threading.Thread(
                target=self.keep_alive, args=(lock, lost), name=f"keepalive-{shard}", daemon=True
            )
            beat.start()
            try:
                while not lost.is_set() and self.orders.leading(since):
                    if not self.unit(client, owner, lock.key, shard):
                        break
            finally:
                lost.set()
                beat.join()
        with_lease = lock.lease
        try:  # resign: the key first (a release), then the lease
            lock.release()
            if with_lease is not None:
                with_lease.revoke()
        except Exception as exc:
            log.info("%s: could not resign (%s)", lock.key, type(exc).__name__)
        log.info("stopped leading %s", lock.key)

    def keep_alive(self, lock: Lock, lost: threading.Event) -> None:
        """The lease's keepalive (a heartbeat each), on a client of its own, until the lease is
        gone or the leader stops."""
        assert lock.lease is not None
        with LockOwner(self.client(), lock.key, lock.lease.id, self.sink) as owner:
            while not lost.wait(self.ttl / 3):
                try:
                    if owner.keepalive() <= 0:
                        log.info("lease of %s lost", lock.key)
                        lost.set()
                except Exception as exc:
                    log.info("keepalive of %s failed (%s)", lock.key, type(exc).__name__)

    def unit(self, client: Etcd3Client, owner: LockOwner, lock_key: str, shard: int) -> bool:
        """One unit of the shard's work; False when the leader must stop (done, or displaced)."""
        index = election.retrying(
            lambda: read_cursor(client, self.root, shard), "reading the cursor"
        )
        if index >= self.units:
            return False
        key = election.effect_key(shard, index)
        owner.attempt(key, destination="etcd")
        self.record(client, lock_key, key, owner.attempt_revision, attempt=True)
        if self.orders.take_failure():
            log.info("%s failed before its effect; retrying it", key)
            return True
        time.sleep(self.work_s)
        fence = election.fenced(shard, index)
        # One ledger key per unit and writer, whose value says the writer's epoch and time:
        # etcd keeps every write made, so the truth can recover one its writer died before
        # recording (`recover`).
        ledger = f"{ledger_prefix(self.root)}{key}/{owner.worker_id}"
        epoch = owner.ownership.owner_epoch if owner.ownership is not None else None
        made = json.dumps({"epoch": epoch, "at": campaign_time(), "process": self.process})
        applied = election.retrying(
            lambda: owner.put(ledger, made, effect_key=key, fenced=fence), "the write"
        )
        self.record(client, lock_key, key, owner.revision, applied=applied)
        if not applied:
            return False  # etcd refused the fence: displaced
        return election.retrying(lambda: self.advance(client, lock_key, shard, index), "the cursor")

    def record(
        self,
        client: Etcd3Client,
        lock_key: str,
        key: str,
        revision: int | None,
        *,
        applied: bool = True,
        attempt: bool = False,
    ) -> None:
        """The truth of a write (or an attempt) made at `revision`: the lock key as etcd held it
        then."""
        ownership = current()
        if self.truth is None or ownership is None:
            return
        # The write's time is its answer's, not the judging read's (up to 1.3 s later under
        # load): the latency to its finding runs from the write.
        at = campaign_time()
        owned, evidence, blind = judged(client, lock_key, revision, ownership.owner_epoch)
        self.truth.record(
            **owner_of(ownership),
            effect_key=key,
            owned=owned,
            evidence=evidence,
            committed=applied,
            attempt=attempt,
            blind=blind,
            at=at,
            seq=revision,
        )

    def advance(self, client: Etcd3Client, lock_key: str, shard: int, index: int) -> bool:
        """Move the cursor on, only while this leader's key still holds the lock."""
        ownership = current()
        epoch = ownership.owner_epoch if ownership is not None else 0
        doc = client.transaction(
            {
                "compare": [
                    {
                        "key": _encode(lock_key),
                        "result": "EQUAL",
                        "target": "CREATE",
                        "create_revision": epoch,
                    }
                ],
                "success": [
                    {
                        "request_put": {
                            "key": _encode(cursor_key(self.root, shard)),
                            "value": _encode(str(index + 1)),
                        }
                    }
                ],
            }
        )
        return bool(doc.get("succeeded", False))


def main() -> None:
    p = election.arguments(__doc__.split("\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--root", required=True, help="the run's key space, without a leading /")
    p.add_argument("--ttl", type=int, default=2, help="the locks' lease, seconds")
    args = p.parse_args()
    worker = EtcdWorker(args.endpoint, args.root, args.units, args.prefer, args.ttl, args.work_s)
    election.serve(worker.orders, args.shards, args.go, worker.run_shard)
    worker.sink.close(5)


if __name__ == "__main__":
    main()
