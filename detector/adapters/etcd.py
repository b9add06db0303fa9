"""etcd locks and elections as ownership events (`pip install 'splitbrain-detector[etcd]'`).

Two pieces. `LockWatcher` is the state of `splitbrain watch etcd`: the keys under each watched
prefix, whose holder is the key with the lowest `create_revision` (etcd's `Mutex` and `Election`
put one key per candidate, `prefix/<lease id>`, and the oldest holds; etcd3gw's `Lock` is one
key). The holder's `create_revision` is its epoch: etcd assigns it, it only grows, and a
transaction comparing it fails once the key is replaced (authority A). `seq` is the revision of
the change: etcd's own total order.

`LockOwner` runs inside the holder's process: it gives the user's effect calls the lock's key and
epoch, turns the client's keepalive into heartbeats (keepalives never appear in a watch), and
offers a fenced write whose rejection is the destination's receipt. Its events go through the
shared sink: they never block or fail the holder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from hashlib import sha256
from types import TracebackType
from typing import Any, Final, Self

from etcd3gw.client import Etcd3Client
from etcd3gw.lock import Lock
from etcd3gw.utils import _encode

from detector.contracts.events import Kind, Source

from ._context import Authority, Ownership, owning, words
from ._etcd_watch import Change, InvalidKvError, Kv, WatchResponse
from ._sink import AdapterSink
from ._watch import GAP_ATTR, Holder, WatchMetrics

log = logging.getLogger(__name__)

EPOCH_FROM: Final = "etcd.create_revision"
DESTINATION: Final = "etcd"
# Why a holder's key went away: a DELETE event carries no owner and no cause.
ENDED_BY_DELETE: Final = "key_deleted"  # the lease was alive: the holder deleted its own key
ENDED_BY_LEASE: Final = "lease_expired_or_revoked"  # TTL -1: etcd removed it with its lease
ENDED_UNKNOWN: Final = "lease_unknown"  # the lease could not be asked about

# A lease's remaining and granted seconds; remaining -1 once it expired or was revoked.
LeaseTtl = Callable[[int], tuple[int, int]]


def worker_of(kv: Kv) -> str:
    """The holder's identity: its lease (etcd names `Mutex` keys by it), else its key."""
    return f"lease-{kv.lease:x}" if kv.lease else f"key-{_short(kv.key)}"


def _short(text: str) -> str:
    return sha256(text.encode()).hexdigest()[:12]


def in_unit(prefix: str, key: str) -> bool:
    """`key` belongs to the lock or election `prefix`: the key itself (etcd3gw's `Lock`), or
    below it (`Mutex`/`Election` keys), never a sibling that merely starts with the same text."""
    if key == prefix:
        return True
    return key.startswith(prefix if prefix.endswith("/") else prefix + "/")


@dataclass(slots=True)
class _Unit:
    """One lock or election: every key under its prefix, and the holder last reported."""

    prefix: str
    revision: int = 0
    keys: dict[str, Kv] = field(default_factory=dict)
    holder: Kv | None = None

    def lowest(self) -> Kv | None:
        return min(self.keys.values(), key=lambda kv: kv.create_revision, default=None)


class LockWatcher:
    """Turns the changes under lock and election prefixes into holder transitions.

    Feed it `relist` (a full listing, at start or after a gap) and `apply` (each watch
    response); each returns the events to publish, as `Emitter.emit` fields. `lease_ttl` asks
    etcd how long a lease has left, to tell a release from an expiry when a holder's key goes.
    """

    def __init__(self, prefixes: Iterable[str], lease_ttl: LeaseTtl, metrics: WatchMetrics) -> None:
        self.units = {p: _Unit(p) for p in prefixes}
        if not self.units or any(not p for p in self.units):
            raise ValueError("at least one non-empty prefix")
        self._lease_ttl = lease_ttl
        self.metrics = metrics

    def _holder(self, unit: _Unit, kv: Kv) -> Holder:
        return Holder(unit.prefix, kv.create_revision, worker_of(kv), Authority.SYSTEM, EPOCH_FROM)

    # ---- persistence: resume from the last revision after a restart ----------------------

    def state(self) -> dict[str, Any]:
        """What a restart needs, per prefix: the revision reached and the keys seen then."""
        return {
            p: {"revision": u.revision, "keys": [kv.to_json() for kv in u.keys.values()]}
            for p, u in self.units.items()
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """The keys and revision a previous run saved; a watched prefix it lacks starts afresh.
        Nothing is published: the previous run published up to that revision."""
        for prefix, unit in self.units.items():
            saved = state.get(prefix)
            if not isinstance(saved, Mapping):
                continue
            unit.keys = {kv.key: kv for kv in map(Kv.from_json, saved.get("keys", []))}
            unit.revision = int(saved["revision"])
            unit.holder = unit.lowest()

    # ---- input ---------------------------------------------------------------------------

    def relist(
        self,
        prefix: str,
        revision: int,
        kvs: Iterable[Kv],
        invalid: Iterable[InvalidKvError] = (),
        *,
        reason: str,
    ) -> list[dict[str, Any]]:
        """A full listing of `prefix` at `revision` (`reason`: `start`, or the gap's cause).

        After a gap the watch may have skipped holders: a new holder is reported acquired at
        the listing's revision (the latest it can have become holder; an earlier guess could
        make its predecessor's last acts look stale), marked `after_gap`. The old holder's end
        is not reported: when and why it ended is exactly what the gap lost."""
        unit = self.units[prefix]
        self._count_invalid(prefix, invalid)
        unit.keys = {kv.key: kv for kv in kvs if in_unit(prefix, kv.key)}
        unit.revision = revision
        new = unit.lowest()
        if new is None or (unit.holder is not None and new == unit.holder):
            unit.holder = new
            return []
        # A single-key lock became held when its key was created; a candidate under a prefix
        # became holder when the keys before it went, at some revision the listing cannot say.
        seq = new.create_revision if new.key == prefix else revision
        unit.holder = new
        event = self._holder(unit, new).event(
            Kind.LEASE_ACQUIRED,
            seq=seq,
            event_id=f"etcd:{seq}:acquired:{new.create_revision}",
            attrs={GAP_ATTR: reason},
            detail=holder_words(new),
            **self._lease_policy(new),
        )
        self.metrics.made(Kind.LEASE_ACQUIRED)
        return [event]

    def compacted(self, prefix: str, response: WatchResponse) -> None:
        """A watch cancelled by compaction: counted and logged; the caller relists."""
        self.metrics.gap("compacted")
        log.warning(
            "etcd watch on %r compacted at revision %d (last seen %d): relisting",
            prefix,
            response.compact_revision,
            self.units[prefix].revision,
        )

    def apply(self, prefix: str, response: WatchResponse) -> list[dict[str, Any]]:
        """One watch response: the holder transitions it holds, in revision order."""
        unit = self.units[prefix]
        self._count_invalid(prefix, response.invalid)
        out: list[dict[str, Any]] = []
        for revision, changes in _by_revision(response.changes):
            if revision <= unit.revision:
                continue  # already applied (a resumed watch repeats nothing, but be sure)
            out.extend(self._apply_revision(unit, revision, changes))
            unit.revision = revision
        unit.revision = max(unit.revision, response.revision)
        return out

    def _apply_revision(
        self, unit: _Unit, revision: int, changes: list[Change]
    ) -> list[dict[str, Any]]:
        for change in changes:
            if not in_unit(unit.prefix, change.kv.key):
                continue
            if change.deleted:
                unit.keys.pop(change.kv.key, None)
            else:
                unit.keys[change.kv.key] = change.kv
        old, new = unit.holder, unit.lowest()
        if old is not None and new is not None and old.create_revision == new.create_revision:
            unit.holder = new  # the holder's own key rewritten: same epoch
            return []
        out: list[dict[str, Any]] = []
        cause = None
        if old is not None and old.key not in unit.keys:
            ended = self._ended(unit, old, revision)
            cause = ended["attrs"]["ended_by"]
            out.append(ended)
        if new is not None:
            out.append(
                self._holder(unit, new).event(
                    Kind.LEASE_ACQUIRED,
                    seq=revision,
                    event_id=f"etcd:{revision}:acquired:{new.create_revision}",
                    # The cause of the move, when the old holder's key went at this revision.
                    detail=holder_words(new, cause=cause),
                    **self._lease_policy(new),
                )
            )
            self.metrics.made(Kind.LEASE_ACQUIRED)
        unit.holder = new
        return out

    def _ended(self, unit: _Unit, old: Kv, revision: int) -> dict[str, Any]:
        """The holder's key is gone: released if its lease still lives, lost if etcd removed
        the key with an expired or revoked lease (-1)."""
        cause = ENDED_BY_DELETE
        if old.lease:
            try:
                if self._lease_ttl(old.lease)[0] < 0:
                    cause = ENDED_BY_LEASE
            except Exception as exc:
                cause = ENDED_UNKNOWN
                log.warning("etcd: lease %x of %r not readable (%s)", old.lease, old.key, exc)
        kind = Kind.LEASE_RELEASED if cause == ENDED_BY_DELETE else Kind.LEASE_LOST
        self.metrics.made(kind)
        return self._holder(unit, old).event(
            kind,
            seq=revision,
            event_id=f"etcd:{revision}:{kind.value}:{old.create_revision}",
            attrs={"ended_by": cause},
            detail=holder_words(old),
        )

    def _lease_policy(self, kv: Kv) -> dict[str, Any]:
        """`lease_duration_s`: the holder's lease as granted, read at the acquisition."""
        if not kv.lease:
            return {}
        try:
            granted = self._lease_ttl(kv.lease)[1]
        except Exception as exc:
            log.warning("etcd: lease %x of %r not readable (%s)", kv.lease, kv.key, exc)
            return {}
        return {"lease_duration_s": granted} if granted > 0 else {}

    def _count_invalid(self, prefix: str, invalid: Iterable[InvalidKvError]) -> None:
        for bad in invalid:
            self.metrics.invalid(bad.reason)
            log.warning("etcd: unreadable key under %r: %s", prefix, bad)


def holder_words(kv: Kv, *, cause: str | None = None) -> dict[str, Any]:
    """A holder in etcd's words (DESIGN §5 `context`): its key, its lease's id as etcd prints
    it (hex), and, for a takeover, why the previous holder's key went (`ended_by`'s values)."""
    return words(key=kv.key, lease_id=f"{kv.lease:x}" if kv.lease else None, cause=cause)


def _by_revision(changes: list[Change]) -> Iterator[tuple[int, list[Change]]]:
    """Consecutive changes of one revision (a transaction) together, in order."""
    batch: list[Change] = []
    for change in changes:
        if batch and change.kv.mod_revision != batch[0].kv.mod_revision:
            yield batch[0].kv.mod_revision, batch
            batch = []
        batch.append(change)
    if batch:
        yield batch[0].kv.mod_revision, batch


# ---- in the holder's process --------------------------------------------------------------


class LockOwner(AbstractContextManager["LockOwner"]):
    """The holder of one etcd lock, for the code that runs while it holds it.

    ::

        lock = client.lock("payments", ttl=10)
        lock.acquire()
        with LockOwner.of_lock(client, lock, sink) as owner:
            owner.keepalive()                  # instead of lock.refresh(): also a heartbeat
            owner.attempt("charge/42")          # effect_attempted, in etcd's order
            owner.put("/ledger/42", "paid", effect_key="charge/42")   # fenced by the lock
            effect_committed("email/42")       # any effect: carries the lock's key and epoch

    `unit` is the prefix `splitbrain watch etcd --prefix` watches (default: the lock's key).
    """

    def __init__(
        self,
        client: Etcd3Client,
        lock_key: str,
        lease: int,
        sink: AdapterSink,
        *,
        unit: str | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.client = client
        self.lock_key = lock_key
        self.lease = lease
        self.unit = unit if unit is not None else lock_key
        self.worker_id = worker_id or f"lease-{lease:x}"
        # The revision etcd gave the last `put` (a refused one: the store's at the refusal):
        # where it sits in etcd's order, to read the store as of that write.
        self.revision: int | None = None
        # The revision of the last `attempt`'s read (None: etcd could not be read), likewise.
        self.attempt_revision: int | None = None
        self._sink = sink
        self.ownership: Ownership | None = None
        self._owning: AbstractContextManager[Ownership] | None = None

    @classmethod
    def of_lock(
        cls, client: Etcd3Client, lock: Lock, sink: AdapterSink, *, unit: str | None = None
    ) -> Self:
        """For an acquired etcd3gw `Lock`."""
        if lock.lease is None:
            raise ValueError("acquire the lock first")
        return cls(client, lock.key, lock.lease.id, sink, unit=unit)

    def __enter__(self) -> Self:
        """Reads the lock key's `create_revision` (the epoch) and runs the block as its owner.
        If the key is not this lease's, the block runs as no one: effects emit nothing."""
        try:
            found = self.client.get(self.lock_key, metadata=True)
        except Exception as exc:  # the holder's work goes on; its effects just name no owner
            log.warning("etcd: cannot read %r (%s): running as no one", self.lock_key, exc)
            return self
        meta = found[0][1] if found else None
        if meta is None or int(meta.get("lease", 0)) != self.lease:
            log.warning("etcd: %r is not held by lease %x", self.lock_key, self.lease)
            return self
        self.ownership = Ownership(
            self._sink,
            self.unit,
            int(meta["create_revision"]),
            self.worker_id,
            Authority.SYSTEM,
            EPOCH_FROM,
            words=words(key=self.lock_key, lease_id=f"{self.lease:x}"),
        )
        self._owning = owning(self.ownership)
        self._owning.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owning is not None:
            self._owning.__exit__(exc_type, exc, tb)
            self._owning = None

    def keepalive(self) -> int:
        """Refresh the lease (what `Lease.refresh` does); its TTL, -1 when it is gone.

        A heartbeat at the store's revision, or `lease_lost` when etcd says the lease is gone:
        the holder now knows it is displaced."""
        doc = self.client.post(self.client.get_url("/lease/keepalive"), json={"ID": self.lease})
        result = doc.get("result", {})
        ttl = int(result.get("TTL", -1))
        if self.ownership is not None:
            seq = _revision(result)
            kind = Kind.HEARTBEAT if ttl > 0 else Kind.LEASE_LOST
            self.ownership.emit(kind, seq=seq, source=Source.WORKER)
        return ttl

    def attempt(
        self,
        effect_key: str,
        *,
        destination: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """`effect_attempted` at etcd's revision: True if the lock key still had this epoch then.

        The lock key is read, and the read's revision is the event's `seq`, so an attempt made
        before a takeover stays before it however late its event arrives (buffered through a
        Kafka outage), and one made after is stale by etcd's order, not by arrival. The answer
        is no fence (the lock may go the next moment): only a fenced `put` is. When etcd cannot
        be read the attempt is still reported, without `seq`, and the answer is False."""
        held = False
        seq: int | None = None
        try:
            doc = self.client.post(
                self.client.get_url("/kv/range"), json={"key": _encode(self.lock_key)}
            )
        except Exception as exc:  # reported all the same: the attempt happened
            log.info("etcd: cannot read %r for an attempt (%s)", self.lock_key, type(exc).__name__)
        else:
            seq = _revision(doc)
            kvs = doc.get("kvs") or []
            held = self.ownership is not None and any(
                int(kv.get("create_revision", 0)) == self.ownership.owner_epoch for kv in kvs
            )
        self.attempt_revision = seq
        if self.ownership is not None:
            self.ownership.effect(
                Kind.EFFECT_ATTEMPTED, effect_key, Source.WORKER, seq, destination, detail
            )
        return held

    def put(self, key: str, value: str, *, effect_key: str, fenced: bool = True) -> bool:
        """Write `key` (the effect `effect_key`); True if etcd applied it.

        Fenced (default): only while the lock key still has this epoch's `create_revision`, in
        one transaction; a refusal is etcd's receipt of a stale fence (`effect_rejected`).
        Unfenced: a plain put, reported committed at its revision, which a displaced holder's
        late write shows as the split-brain it is."""
        put = {"request_put": {"key": _encode(key), "value": _encode(value)}}
        epoch = self.ownership.owner_epoch if self.ownership is not None else 0
        compare = [
            {
                "key": _encode(self.lock_key),
                "result": "EQUAL",
                "target": "CREATE",
                "create_revision": epoch,
            }
        ]
        txn = {"compare": compare if fenced else [], "success": [put]}
        doc = self.client.transaction(txn)
        applied = bool(doc.get("succeeded", False))
        self.revision = _revision(doc)
        if self.ownership is not None:
            self.ownership.emit(
                Kind.EFFECT_COMMITTED if applied else Kind.EFFECT_REJECTED,
                effect_key=effect_key,
                destination=DESTINATION,
                source=Source.DESTINATION,
                seq=_revision(doc),
                detail={"fenced": fenced},
            )
        return applied


def _revision(doc: Mapping[str, Any]) -> int | None:
    try:
        return int(doc["header"]["revision"])
    except (KeyError, TypeError, ValueError):
        return None
