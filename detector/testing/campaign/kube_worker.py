"""A campaign worker on Kubernetes: `python -m detector.testing.campaign.kube_worker --kubeconfig
F --namespace NS --name P --identity ID --shards N --units U --prefer K` (Kafka, topic and truth
log from the environment the campaign gives it).

Each shard is a Lease `P-shard-K`, elected with the adapter's `LeaderElector` (the Python
client's election) again and again. Its work does the shard's units, each in a thread of its own:
the elector stops the work by raising in the work's thread, which then waits for the unit begun
to finish (a unit, once begun, completes, as a real one does). A unit's effect is a key of the
ConfigMap `P-shard-K`; its cursor, in the same ConfigMap, only moves forward.

The ground truth of each write is the Lease as the API server held it at the write's own
resourceVersion (a list with `resourceVersionMatch=Exact`, etcd's MVCC read underneath): the
executor owned the shard iff the Lease's holderIdentity was its identity and its acquireTime that
of the acquisition it won with. The Python client's election never writes leaseTransitions, so
the tenure is told by acquireTime, and the adapter's epoch is the acquiring write's
resourceVersion.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from detector.adapters import current
from detector.adapters.kubernetes import LeaderElector, LeadershipLostError
from detector.testing.campaign import election
from detector.testing.campaign.truth import TruthLog, campaign_time, owner_of
from detector.testing.campaign.worker import sink

log = logging.getLogger("campaign.kubernetes")

# Set on a write made while the Lease had no holder (released, nobody took it yet): no later
# owner existed for the write to be stale against.
NO_HOLDER: Final = "no_holder"
# Set on an attempt made while the Lease could not be read: its event carries no seq (ordered by
# arrival), and the truth cannot place it in the API server's order either.
UNREAD: Final = "attempt_unread"
LEASE_S = 3  # the Lease's duration; the elector renews every second and gives up after 2 s


class StepDownError(Exception):
    """Raised by the work at a unit's end: stop leading (a stop order, a handoff)."""


def shard_name(name: str, shard: int) -> str:
    """The Lease, and the ConfigMap holding the shard's effects and cursor."""
    return f"{name}-shard-{shard}"


def read_cursor(core: client.CoreV1Api, namespace: str, name: str) -> int:
    found: Any = core.read_namespaced_config_map(name, namespace)
    return int((found.data or {}).get("cursor", "0"))


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def made_path(truth: Path) -> Path:
    """Where the workers note each write the API server answered, before judging it: a worker
    killed between the two leaves the write out of the truth, and `recover` judges it from
    here at the run's end."""
    return truth.with_name(f"{truth.stem}.made.jsonl")


def judged(
    leases: Any, namespace: str, lease: str, rv: int | None, identity: str, won_at: datetime | None
) -> tuple[bool, str, str | None]:
    """(owned, evidence, blind) of a write (or an attempt) of `identity` at `rv`: the Lease as
    the API server held it then (a list at that resourceVersion, `Exact`)."""
    if rv is None:  # only an attempt: a write's answer always carries one
        return False, f"Lease {lease} could not be read at the attempt", UNREAD
    at = str(rv)
    found: Any = election.retrying(
        lambda: leases.list_namespaced_lease(
            namespace,
            field_selector=f"metadata.name={lease}",
            resource_version=at,
            resource_version_match="Exact",
        ),
        "reading the Lease",
    )
    spec = found.items[0].spec if found.items else None
    holder = spec.holder_identity if spec is not None else None
    since = _time(spec.acquire_time) if spec is not None else None
    evidence = (
        f"Lease {lease} at resourceVersion {rv}: holderIdentity {holder}, "
        f"acquireTime {since.isoformat() if since else None}"
    )
    owned = holder == identity and since == won_at
    return owned, evidence, NO_HOLDER if holder is None else None


def recover(leases: Any, namespace: str, truth: TruthLog) -> int:
    """Record the writes the API server made whose writer died before it recorded them (a
    SIGKILL between the write's answer and its record); how many. Each is judged as its writer
    would have: the Lease at the write's resourceVersion."""
    try:
        lines = made_path(truth.path).read_text().splitlines()
    except FileNotFoundError:
        return 0
    recorded = {(w.effect_key, w.executor) for w in truth.writes() if w.committed}
    found = 0
    for line in lines:
        try:
            made = json.loads(line)
        except ValueError:  # the last line of a writer killed while noting it
            continue
        if (made["effect_key"], made["executor"]) in recorded:
            continue
        owned, evidence, blind = judged(
            leases,
            namespace,
            made["lease"],
            made["rv"],
            made["executor"],
            _time(made["won_at"]),
        )
        TruthLog(truth.path, truth.run, made["process"]).record(
            workflow_key=made["workflow_key"],
            effect_key=made["effect_key"],
            executor=made["executor"],
            epoch=made["epoch"],
            owned=owned,
            evidence=f"{evidence} (recovered: its writer died before recording it)",
            at=made["at"],
            blind=blind,
        )
        recorded.add((made["effect_key"], made["executor"]))
        found += 1
    return found


class KubeWorker:
    def __init__(self, namespace: str, name: str, identity: str, units: int, prefer: int):
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.units = units
        self.prefer = prefer
        self.work_s = 0.5
        self.orders = election.Orders()
        self.sink = sink("kubernetes")
        self.truth = TruthLog.from_env()
        self.core = client.CoreV1Api()
        self.leases = client.CoordinationV1Api()

    def run_shard(self, shard: int) -> None:
        lease = shard_name(self.name, shard)
        self.orders.wait_for_the_preferred(shard == self.prefer)
        while not self.orders.stopping.is_set():
            if self.orders.sitting_out() or self.done(lease):
                self.orders.wait_to_try(shard == self.prefer)
                continue
            self.elect(lease, shard)

    def elect(self, lease: str, shard: int) -> None:
        """One election: as a candidate until it leads, then leading until it stops; then it
        resigns the Lease if it led."""
        led: list[float] = []
        units: list[threading.Thread] = []
        elector = LeaderElector(
            lease,
            self.namespace,
            self.identity,
            lambda stop: self.work(elector, lease, shard, led, units),
            self.sink,
            lease_duration=LEASE_S,
            renew_deadline=LEASE_S - 1,
            retry_period=1,  # the client exits the thread unless renew_deadline > 1.2 x this
        )
        try:
            elector.run()  # returns once it stopped leading
        except Exception as exc:  # the API server out of reach
            log.info("%s: election interrupted (%s)", lease, type(exc).__name__)
            self.orders.stopping.wait(1.0)
        if led:
            # The elector returns once its work's thread ended, while the unit that thread began
            # (a thread of its own, so that the elector's LeadershipLostError does not cut its
            # write) may still be writing: it completes, as a real one does. This leadership
            # ends only after it: a stop order's exit closes the sink then, and the write's
            # events would be dropped unsent (kubernetes run 26 of the 50b6f43 campaign).
            for unit in units:
                with contextlib.suppress(RuntimeError):  # never started
                    unit.join(election.RESIGN_S)
            self.resign(lease)
            self.orders.ended()

    def done(self, lease: str) -> bool:
        try:
            return read_cursor(self.core, self.namespace, lease) >= self.units
        except Exception:
            return False

    def work(
        self,
        elector: LeaderElector,
        lease: str,
        shard: int,
        led: list[float],
        units: list[threading.Thread],
    ) -> None:
        """The leader's loop (`led` gets when it began, `units` the unit under way; the shard's
        thread waits for that unit and resigns once the elector stopped)."""
        acquired = elector.lock.acquired
        won_at = _time(acquired.spec.acquire_time) if acquired is not None else None
        since = self.orders.began()
        led.append(since)
        if elector.ownership is None:
            # Leading by renewing a Lease this identity still held (the election restarted
            # after an error): no acquiring write, so the adapter cannot name the epoch and the
            # work's effects would carry none. Stand down and stand again for a new tenure.
            raise StepDownError
        while True:
            if not self.orders.leading(since):
                raise StepDownError
            index = election.retrying(
                lambda: read_cursor(self.core, self.namespace, lease),
                "reading the cursor",
                fatal=(LeadershipLostError,),
            )
            if index >= self.units:
                self.orders.stopping.wait(0.5)
                continue
            unit = threading.Thread(
                target=contextvars.copy_context().run,
                args=(self.unit, elector, lease, shard, index, won_at),
                name=f"unit-{shard}",
                daemon=True,
            )
            units[:] = [unit]
            unit.start()
            unit.join()

    def unit(
        self, elector: LeaderElector, lease: str, shard: int, index: int, won_at: datetime | None
    ) -> None:
        key = election.effect_key(shard, index)
        elector.attempt(key, destination="configmap")
        self.record(
            lease, key, elector.attempt_resource_version, won_at, campaign_time(), attempt=True
        )
        if self.orders.take_failure():
            log.info("%s failed before its effect; retrying it", key)
            return
        time.sleep(self.work_s)
        written: Any = election.retrying(
            lambda: self.core.patch_namespaced_config_map(
                lease, self.namespace, {"data": {f"unit-{index}": self.identity}}
            ),
            "the write",
        )
        # The API server's answer is the destination's receipt of the write, at the write's
        # resourceVersion: the ConfigMap is stored beside the Lease, in the same order.
        rv = int(written.metadata.resource_version)
        at = campaign_time()  # at the answer: a pause may land before the record
        self.made(lease, key, rv, won_at, at)
        elector.committed(key, rv, destination="configmap")
        self.record(lease, key, rv, won_at, at)
        election.retrying(lambda: self.advance(lease, index), "the cursor")

    def made(self, lease: str, key: str, rv: int, won_at: datetime | None, at: float) -> None:
        """Note a write the API server answered at `rv`, before judging it (`recover`)."""
        ownership = current()
        if self.truth is None or ownership is None:
            return
        line = json.dumps(
            {
                **owner_of(ownership),
                "lease": lease,
                "effect_key": key,
                "rv": rv,
                "won_at": won_at.isoformat() if won_at is not None else None,
                "at": at,
                "process": self.truth.process,
            }
        )
        with made_path(self.truth.path).open("a") as f:
            f.write(line + "\n")

    def record(
        self,
        lease: str,
        key: str,
        rv: int | None,
        won_at: datetime | None,
        at: float,
        *,
        attempt: bool = False,
    ) -> None:
        """The truth of a write (or an attempt) at `rv`, made at `at` (`campaign_time`, at the
        API server's answer: the judging read below, or a pause, can come seconds later): the
        Lease as the API server held it."""
        ownership = current()
        if self.truth is None or ownership is None:
            return
        owned, evidence, blind = judged(
            self.leases, self.namespace, lease, rv, self.identity, won_at
        )
        self.truth.record(
            **owner_of(ownership),
            effect_key=key,
            owned=owned,
            evidence=evidence,
            attempt=attempt,
            blind=blind,
            at=at,
            seq=rv,
        )

    def advance(self, lease: str, index: int) -> None:
        """The cursor to `index + 1` unless it is past it already (a write conditional on the
        ConfigMap's resourceVersion: a late leader never moves it back)."""
        while True:
            found: Any = self.core.read_namespaced_config_map(lease, self.namespace)
            if int((found.data or {}).get("cursor", "0")) > index:
                return
            found.data = {**(found.data or {}), "cursor": str(index + 1)}
            try:
                self.core.replace_namespaced_config_map(lease, self.namespace, found)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def resign(self, lease: str) -> None:
        """Give the Lease up if this worker still holds it (holderIdentity emptied), so that
        another can take it at once: a graceful shutdown's or a handoff's release."""
        try:
            found: Any = self.leases.read_namespaced_lease(lease, self.namespace)
            if found.spec.holder_identity != self.identity:
                return
            found.spec.holder_identity = None
            self.leases.replace_namespaced_lease(lease, self.namespace, found)
            log.info("resigned %s", lease)
        except Exception as exc:
            log.info("%s: could not resign (%s)", lease, type(exc).__name__)


def main() -> None:
    p = election.arguments(__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--name", required=True, help="the run's Leases and ConfigMaps: NAME-shard-K")
    p.add_argument("--identity", required=True, help="the worker's name; its pid is added")
    args = p.parse_args()
    config.load_kube_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    # A restarted worker is a new pod: a new identity, never its predecessor's leadership.
    identity = f"{args.identity}-{os.getpid()}"
    worker = KubeWorker(args.namespace, args.name, identity, args.units, args.prefer)
    worker.work_s = args.work_s
    election.serve(worker.orders, args.shards, args.go, worker.run_shard)
    worker.sink.close(5)


if __name__ == "__main__":
    main()
