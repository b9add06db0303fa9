"""Kubernetes Leases as ownership events (`pip install 'splitbrain-detector[kubernetes]'`).

`LeaseWatcher` is the state of `splitbrain watch kubernetes`: it reads `coordination.k8s.io/v1`
Lease objects as the API server's watch delivers them (`{"type", "object"}` dicts, JSON as on the
wire, so a recorded stream replays through the same code). A holder change is an acquisition, the
same holder with a later `renewTime` a heartbeat, an empty holder a release; the old holder's loss
is implied by the next acquisition. `seq` is the object's `resourceVersion`, which the API server
assigns from etcd's revision and v1.35 made officially comparable (KEP-5504).

The epoch: `leaseTransitions` where the writer maintains it (client-go adds one per acquisition,
and the API server's optimistic concurrency lets one writer win each value), else the acquiring
write's `resourceVersion` (the Python client's elector never writes the transitions). Each event
says which in `attrs.epoch_from`. A Lease deleted and created again restarts its transitions: the
watcher then takes the resourceVersion for that Lease from there on, so its epochs still grow.

`LeaderElector` wraps the Python client's `LeaderElection`, which calls "stopped leading" and
lets the work go on: this one stops the work (an exception raised in its thread, and an event it
can wait on) and gives the work's effect calls the Lease's key and epoch. Its `attempt` and
`committed` place the work's effects in the API server's order (the Lease's, and the write's,
resourceVersion as `seq`), as the watcher's holders are.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from detector.contracts.events import Kind, Source

from ._context import Authority, Ownership, owning, words
from ._sink import AdapterSink
from ._watch import GAP_ATTR, Holder, UnreadableError, WatchMetrics

log = logging.getLogger(__name__)

FROM_TRANSITIONS: Final = "kubernetes.leaseTransitions"
FROM_RESOURCE_VERSION: Final = "kubernetes.resourceVersion"


def lease_key(namespace: str, name: str) -> str:
    """The workflow key of a Lease's events: `namespace/name`."""
    return f"{namespace}/{name}"


class InvalidLeaseError(UnreadableError):
    """A Lease the watcher cannot read."""

    noun = "lease"


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What the watcher reads of one Lease object."""

    key: str
    uid: str
    resource_version: int
    holder: str  # "" when nobody holds it
    transitions: int | None
    renew_time: datetime | None
    duration_s: int | None


def _time(spec: Mapping[str, Any], name: str, key: str) -> datetime | None:
    raw = spec.get(name)
    if raw is None:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidLeaseError(f"bad_{name}", key) from None


def _optional_int(spec: Mapping[str, Any], name: str, key: str) -> int | None:
    raw = spec.get(name)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise InvalidLeaseError(f"bad_{name}", key)
    return raw


def parse_lease(obj: Any) -> LeaseView:
    """A Lease as JSON (the wire's camelCase); raises `InvalidLeaseError`."""
    if not isinstance(obj, Mapping):
        raise InvalidLeaseError("not_an_object", "?")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name") or not meta.get("namespace"):
        raise InvalidLeaseError("no_name", "?")
    key = lease_key(str(meta["namespace"]), str(meta["name"]))
    try:
        rv = int(str(meta.get("resourceVersion")))
    except ValueError:
        raise InvalidLeaseError("bad_resourceVersion", key) from None
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidLeaseError("bad_spec", key)
    holder = spec.get("holderIdentity") or ""
    if not isinstance(holder, str):
        raise InvalidLeaseError("bad_holderIdentity", key)
    return LeaseView(
        key=key,
        uid=str(meta.get("uid", "")),
        resource_version=rv,
        holder=holder,
        transitions=_optional_int(spec, "leaseTransitions", key),
        renew_time=_time(spec, "renewTime", key),
        duration_s=_optional_int(spec, "leaseDurationSeconds", key),
    )


@dataclass(slots=True)
class _Tracked:
    """The last state reported for one Lease."""

    view: LeaseView
    holder: Holder | None  # None: nobody holds it
    by_resource_version: bool  # the epoch source once the transitions cannot be trusted


RENEW_TIME_EXPIRED: Final = "renew_time_expired"  # renewTime + leaseDurationSeconds had passed
TAKEN_BEFORE_EXPIRY: Final = "taken_before_expiry"  # ... had not, by the new holder's renewTime
RELEASED: Final = "released"  # the Lease had no holder first
REACQUIRED: Final = "reacquired"  # the same holder, with new transitions


def lease_words(view: LeaseView, *, cause: str | None = None) -> dict[str, Any]:
    """A Lease in its own words (DESIGN §5 `context`): its namespace and name, holderIdentity,
    leaseTransitions, and for a takeover the cause read from the Lease before and after."""
    namespace, _, name = view.key.partition("/")
    return words(
        lease=name,
        namespace=namespace,
        holder_identity=view.holder or None,
        lease_transitions=view.transitions,
        cause=cause,
    )


def _takeover(seen: _Tracked | None, old: Holder | None, view: LeaseView) -> str | None:
    """Why the Lease moved, as its fields show it: none for the first sight of it."""
    if seen is None:
        return None
    if old is None:
        return RELEASED
    if old.worker_id == view.holder:
        return REACQUIRED
    before = seen.view
    if before.renew_time is None or not before.duration_s or view.renew_time is None:
        return None
    expiry = before.renew_time + timedelta(seconds=before.duration_s)
    return RENEW_TIME_EXPIRED if view.renew_time >= expiry else TAKEN_BEFORE_EXPIRY


class LeaseWatcher:
    """Turns Lease watch events into holder transitions.

    `wanted(key)` says which Leases to follow (the `--lease` names, or all that a label selector
    lets through). Feed `relist(items, reason)` at start and after a 410, and `apply(event)` for
    each watch event; both return the events to publish as `Emitter.emit` fields.
    """

    def __init__(self, wanted: Callable[[str], bool], metrics: WatchMetrics) -> None:
        self._wanted = wanted
        self.metrics = metrics
        self.leases: dict[str, _Tracked] = {}
        self.resource_version = ""  # where a watch resumes (the list's, or the last event's)
        self.gone = False  # a 410 ended the watch: the caller relists

    def relist(
        self, items: Iterable[Any], resource_version: str, *, reason: str
    ) -> list[dict[str, Any]]:
        """Every Lease now. After a gap (`reason` other than `start`), holders the watch missed
        are reported acquired at the listed resourceVersion, marked `after_gap`."""
        out: list[dict[str, Any]] = []
        for obj in items:
            out.extend(self._observe(obj, gap=reason))
        self.resource_version = resource_version
        self.gone = False
        return out

    def apply(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One watch event. A 410 sets `gone`, which the caller answers by relisting; anything
        unreadable is counted and logged, never raised."""
        kind = event.get("type")
        obj = event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            if code == 410:
                self.metrics.gap("gone")
                log.warning(
                    "kubernetes: watch expired at resourceVersion %s (410): relisting",
                    self.resource_version,
                )
                self.gone = True
                return []
            self.metrics.invalid("watch_error")
            log.warning("kubernetes: watch error %s", str(obj)[:200])
            return []
        if kind == "BOOKMARK":
            rv = (
                obj.get("metadata", {}).get("resourceVersion") if isinstance(obj, Mapping) else None
            )
            if rv:
                self.resource_version = str(rv)
            return []
        if kind == "DELETED":
            try:
                view = parse_lease(obj)
            except InvalidLeaseError as exc:
                self._invalid(exc)
                return []
            if self.leases.pop(view.key, None) is not None:
                log.info("kubernetes: lease %s deleted", view.key)
            self.resource_version = str(view.resource_version)
            return []
        if kind not in ("ADDED", "MODIFIED"):
            self.metrics.invalid("bad_event_type")
            log.warning("kubernetes: watch event of type %r skipped", str(kind)[:40])
            return []
        return self._observe(obj, gap=None)

    def _invalid(self, exc: InvalidLeaseError) -> None:
        self.metrics.invalid(exc.reason)
        log.warning("kubernetes: unreadable lease: %s", exc)

    def _observe(self, obj: Any, *, gap: str | None) -> list[dict[str, Any]]:
        try:
            view = parse_lease(obj)
        except InvalidLeaseError as exc:
            self._invalid(exc)
            return []
        if not self._wanted(view.key):
            return []
        self.resource_version = str(view.resource_version)
        seen = self.leases.get(view.key)
        if seen is not None and view.resource_version <= seen.view.resource_version:
            return []  # already seen (a relist repeats what the watch delivered)
        by_rv = view.transitions is None
        if seen is not None and seen.view.uid != view.uid:
            # Deleted and created again: its transitions start over, lower than the epochs
            # already reported; from here on the resourceVersion is its epoch.
            self.metrics.gap("recreated")
            log.warning(
                "kubernetes: lease %s was recreated (new uid): epochs from resourceVersion",
                view.key,
            )
            by_rv = True
        elif seen is not None:
            by_rv = by_rv or seen.by_resource_version
        out = self._transition(seen, view, by_rv, gap)
        return out

    def _transition(
        self, seen: _Tracked | None, view: LeaseView, by_rv: bool, gap: str | None
    ) -> list[dict[str, Any]]:
        old = seen.holder if seen is not None else None
        rv = view.resource_version
        out: list[dict[str, Any]] = []
        if not view.holder:
            if old is not None:
                out.append(self._event(old, Kind.LEASE_RELEASED, rv))
            self.leases[view.key] = _Tracked(view, None, by_rv)
            return out
        reacquired = (
            old is not None
            and not by_rv
            and view.transitions is not None
            and view.transitions != old.owner_epoch
        )
        if old is not None and old.worker_id == view.holder and not reacquired:
            self.leases[view.key] = _Tracked(view, old, by_rv)
            renewed = seen is not None and (
                view.renew_time is not None
                and (seen.view.renew_time is None or view.renew_time > seen.view.renew_time)
            )
            if renewed:
                out.append(self._event(old, Kind.HEARTBEAT, rv))
            return out
        epoch = rv if by_rv else view.transitions
        assert epoch is not None
        holder = Holder(
            view.key,
            epoch,
            view.holder,
            Authority.SYSTEM,
            FROM_RESOURCE_VERSION if by_rv else FROM_TRANSITIONS,
        )
        attrs: dict[str, str] = {}
        if gap is not None and gap != "start":
            attrs[GAP_ATTR] = gap
        if (
            not by_rv
            and old is not None
            and old.epoch_from == FROM_TRANSITIONS
            and epoch > old.owner_epoch + 1
        ):
            # Holders came and went between two events the watch delivered (a 410's relist).
            self.metrics.gap("skipped_holders")
            log.warning(
                "kubernetes: lease %s went from transition %d to %d: %d holder(s) unseen",
                view.key,
                old.owner_epoch,
                epoch,
                epoch - old.owner_epoch - 1,
            )
            attrs[GAP_ATTR] = attrs.get(GAP_ATTR, "skipped_holders")
        fields: dict[str, Any] = {"detail": lease_words(view, cause=_takeover(seen, old, view))}
        if view.duration_s:
            fields["lease_duration_s"] = view.duration_s
        out.append(self._event(holder, Kind.LEASE_ACQUIRED, rv, attrs, **fields))
        self.leases[view.key] = _Tracked(view, holder, by_rv)
        return out

    def _event(
        self,
        holder: Holder,
        kind: Kind,
        rv: int,
        attrs: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        self.metrics.made(kind)
        return holder.event(
            kind,
            seq=rv,
            event_id=f"k8s:{rv}:{kind.value}:{holder.owner_epoch}",
            attrs=attrs,
            **fields,
        )

    def state(self) -> dict[str, Any]:
        """What a restart needs to resume the watch where it got: the resourceVersion and the
        state last reported per Lease (so a renewal after the restart is not a new holder)."""
        return {
            "resource_version": self.resource_version,
            "leases": {
                key: {
                    "uid": t.view.uid,
                    "resource_version": t.view.resource_version,
                    "holder": t.view.holder,
                    "transitions": t.view.transitions,
                    "renew_time": None
                    if t.view.renew_time is None
                    else t.view.renew_time.isoformat(),
                    "duration_s": t.view.duration_s,
                    "epoch": None if t.holder is None else t.holder.owner_epoch,
                    "by_resource_version": t.by_resource_version,
                }
                for key, t in self.leases.items()
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.resource_version = str(state.get("resource_version", ""))
        for key, saved in dict(state.get("leases", {})).items():
            view = LeaseView(
                key,
                saved["uid"],
                saved["resource_version"],
                saved["holder"],
                saved["transitions"],
                None
                if saved["renew_time"] is None
                else datetime.fromisoformat(saved["renew_time"]),
                saved["duration_s"],
            )
            by_rv = bool(saved["by_resource_version"])
            holder = None
            if saved["epoch"] is not None:
                holder = Holder(
                    key,
                    int(saved["epoch"]),
                    view.holder,
                    Authority.SYSTEM,
                    FROM_RESOURCE_VERSION if by_rv else FROM_TRANSITIONS,
                )
            self.leases[key] = _Tracked(view, holder, by_rv)


def feed(watcher: LeaseWatcher, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Events from a source of watch events, as the API server sends them or as recorded. A
    `LIST` event (`object`: the list's JSON) is a relist, `reason` in its `reason` field."""
    out: list[dict[str, Any]] = []
    for event in events:
        if event.get("type") == "LIST":
            listing = event.get("object") or {}
            out.extend(
                watcher.relist(
                    listing.get("items") or [],
                    str(listing.get("metadata", {}).get("resourceVersion", "")),
                    reason=str(event.get("reason", "start")),
                )
            )
        else:
            out.extend(watcher.apply(event))
    return out


# ---- in the candidate's process -------------------------------------------------------------


class LeadershipLostError(Exception):
    """Raised in the work's thread when its elector stopped leading: the work must stop."""


def _raise_in(thread_id: int, exc: type[BaseException]) -> bool:
    """Raise `exc` in another thread at its next Python instruction (a blocking C call, such as
    a sleep or a socket read, finishes first)."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc)
    )
    return bool(done == 1)


class LeaderElector:
    """The Python client's leader election, with the work stopped when leadership ends.

    ::

        elector = LeaderElector("payments-leader", "default", "pod-7", work, sink)
        elector.run()   # blocks, as LeaderElection.run does; returns after stopped leading

    `work(stop)` runs while leading, under the Lease's key and epoch (`effect_committed` inside
    it carries them); on "stopped leading" `stop` is set, `LeadershipLostError` is raised in its
    thread, a `lease_lost` is sent, and `on_stopped` is called. `run` then waits for the work's
    thread to end, at most `stop_timeout` seconds (default: `lease_duration`), so a process that
    exits (or closes its sink) once `run` returns keeps the last write's events; past the bound
    it logs that the work still runs and returns. `kubernetes.config` must be loaded first, as
    for `LeaseLock`.
    """

    def __init__(
        self,
        name: str,
        namespace: str,
        identity: str,
        work: Callable[[threading.Event], None],
        sink: AdapterSink,
        *,
        lease_duration: int = 15,
        renew_deadline: int = 10,
        retry_period: int = 2,
        on_stopped: Callable[[], None] | None = None,
        stop_timeout: float | None = None,
    ) -> None:
        if stop_timeout is not None and not 0 <= stop_timeout < math.inf:
            raise ValueError(f"stop_timeout must be 0 or more seconds, not {stop_timeout}")
        self.stop_timeout = float(lease_duration if stop_timeout is None else stop_timeout)
        self.lock = _RecordingLeaseLock(name, namespace, identity)
        self.stop = threading.Event()
        self.ownership: Ownership | None = None
        # The Lease's resourceVersion as the last `attempt` read it (None: it could not be
        # read): where that attempt sits in the API server's order.
        self.attempt_resource_version: int | None = None
        self._work = work
        self._sink = sink
        self._on_stopped = on_stopped
        self._thread_id: int | None = None
        self._work_thread: threading.Thread | None = None  # the client's, running `_started`
        self._leading = False
        self._election = leaderelection.LeaderElection(
            electionconfig.Config(
                self.lock,
                lease_duration,
                renew_deadline,
                retry_period,
                self._started,
                self._stopped,
            )
        )

    def run(self) -> None:
        """The election. The Python client raises out of it when the API server cannot be
        reached (only an API error is retried) and never calls "stopped leading": a leader's
        work would go on unrenewed, so it is stopped here as a lost leadership is, then the
        error raised. Either way it returns (or raises) once the work's thread ended, or
        `stop_timeout` passed: the client returns at once, its work still writing."""
        try:
            self._election.run()
        except BaseException:
            if self._leading and not self.stop.is_set():
                self._stopped()
            raise
        finally:
            self._await_work()

    def _await_work(self) -> None:
        """Wait for the work the election started, within `stop_timeout`; say it if it runs on
        (a blocking call that ignores the stop): its later effects are the host's to await."""
        thread = self._work_thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(self.stop_timeout)
        if thread.is_alive():
            log.warning(
                "kubernetes: %s's work still runs %gs after leadership ended (stop_timeout): "
                "run() returns without it; effects it sends once its sink is closed are dropped",
                self.lock.identity,
                self.stop_timeout,
            )

    def attempt(
        self,
        effect_key: str,
        *,
        destination: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """`effect_attempted` at the Lease's resourceVersion: True if this elector still held it.

        The Lease is read, and its resourceVersion is the event's `seq` (the order the watcher
        reports takeovers in): an attempt made before a takeover stays before it however late
        its event arrives, and one made after is stale by the API server's order, not by
        arrival. The answer is no fence (the Lease may change the next moment). When the Lease
        cannot be read the attempt is still reported, without `seq`, and the answer is False."""
        held = False
        seq: int | None = None
        try:
            raw: Any = self.lock.api_instance.read_namespaced_lease(  # unparsed: urllib3's
                self.lock.name, self.lock.namespace, _preload_content=False
            )
            now = parse_lease(json.loads(raw.data))
        except Exception as exc:  # reported all the same: the attempt happened
            log.info("kubernetes: cannot read lease %s (%s)", self.lock.name, type(exc).__name__)
        else:
            seq = now.resource_version
            ours = self.ownership
            if ours is not None and now.holder == self.lock.identity:
                # The same tenure by its transitions; by resourceVersion the holder is all a
                # read can tell.
                by_rv = ours.epoch_from == FROM_RESOURCE_VERSION
                held = by_rv or now.transitions == ours.owner_epoch
        self.attempt_resource_version = seq
        if self.ownership is not None:
            self.ownership.effect(
                Kind.EFFECT_ATTEMPTED, effect_key, Source.WORKER, seq, destination, detail
            )
        return held

    def committed(
        self,
        effect_key: str,
        resource_version: int | str | None,
        *,
        destination: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> bool:
        """`effect_committed` of a write the API server made: its answer's `resourceVersion` is
        the event's `seq`, the destination's receipt (as etcd's revision is for `LockOwner.put`).

        The watcher's takeovers carry the Lease's resourceVersion, which the same API server
        assigns from the same etcd revision: a write made after a takeover is stale by the API
        server's order even when its event arrives before the watcher's (a watcher relisting
        after the API server's restart), and one made before stays before it however late its
        event arrives. For a destination stored beside the Lease (a ConfigMap, any built-in
        resource of the cluster); anything else reports with `effect_committed`, by arrival.
        False when not leading under an epoch (nothing is sent)."""
        if self.ownership is None:
            return False
        seq = None if resource_version is None else int(resource_version)
        self.ownership.effect(
            Kind.EFFECT_COMMITTED, effect_key, Source.DESTINATION, seq, destination, detail
        )
        return True

    def _started(self) -> None:
        self._work_thread = threading.current_thread()
        self._leading = True
        lease = self.lock.acquired
        if lease is None:  # the elector led without a write of ours: cannot name the epoch
            log.warning("kubernetes: leading %s without an acquiring write", self.lock.name)
            self._work(self.stop)
            return
        transitions = lease.spec.lease_transitions
        by_rv = transitions is None
        self.ownership = Ownership(
            self._sink,
            lease_key(self.lock.namespace, self.lock.name),
            int(lease.metadata.resource_version) if by_rv else int(transitions),
            self.lock.identity,
            Authority.SYSTEM,
            FROM_RESOURCE_VERSION if by_rv else FROM_TRANSITIONS,
            words=words(
                lease=self.lock.name,
                namespace=self.lock.namespace,
                holder_identity=self.lock.identity,
                lease_transitions=transitions,
            ),
        )
        self._thread_id = threading.get_ident()
        try:
            with owning(self.ownership):
                self._work(self.stop)
        except LeadershipLostError:
            log.info("kubernetes: %s stopped its work: leadership lost", self.lock.identity)
        finally:
            self._thread_id = None

    def _stopped(self) -> None:
        self.stop.set()
        if self.ownership is not None:
            self.ownership.emit(Kind.LEASE_LOST, source=Source.WORKER)
        thread_id = self._thread_id
        if thread_id is not None:
            _raise_in(thread_id, LeadershipLostError)
        if self._on_stopped is not None:
            self._on_stopped()


class _RecordingLeaseLock(LeaseLock):
    """A `LeaseLock` that keeps the Lease its acquiring write returned: the write whose
    resourceVersion (or transitions) the watcher reports as the epoch.

    It also keeps `leaseTransitions` as client-go does (0 at creation, one more each time the
    holder changes), on the Leases it creates and on those that already carry them: the epoch is
    then in the object itself, so a watcher that relists after missing the acquiring write still
    reports the epoch the holder works under. (With the resourceVersion it could only report the
    listed one, later than the acquiring write's: the holder's own effects looked stale to it, a
    false critical finding the fault campaign caught after an API server restart.)"""

    acquired: Any = None

    def get_lease_spec(self, leader_election_record: Any, current_spec: Any = None) -> Any:
        previous = None if current_spec is None else current_spec.holder_identity
        transitions = None if current_spec is None else current_spec.lease_transitions
        spec = super().get_lease_spec(leader_election_record, current_spec)
        if current_spec is None:
            spec.lease_transitions = 0
        elif transitions is not None and previous != leader_election_record.holder_identity:
            spec.lease_transitions = transitions + 1
        return spec

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        created = bool(super().create(name, namespace, election_record))
        if created:
            self.acquired = self.lease_reference
        return created

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        """`LeaseLock.update`, keeping the written Lease when it took the lease from another."""
        before = self.lease_reference
        if before is None:
            return False
        previous = before.spec.holder_identity if before.spec is not None else None
        try:
            before.spec = self.get_lease_spec(updated_record, before.spec)
            written = self.api_instance.replace_namespaced_lease(
                name=name, namespace=namespace, body=before
            )
        except ApiException as exc:
            log.info("kubernetes: lease %s not updated (%s)", name, exc.status)
            return False
        if previous != self.identity:
            self.acquired = written
        return True
