"""`splitbrain watch etcd|kubernetes`: a coordination store's lease holders as ownership events.

A watcher is a process of its own beside the fleet: it follows the store's lock, election or
Lease objects and publishes each holder change through the same `Emitter` as the workers,
waiting for Kafka's acknowledgement before it records how far it got. The store's revision is
the `seq` of every event, so the detector orders a takeover against the displaced holder's
effects by the store's clock, never by arrival.

Where it resumes from is a small state file (`--state-file`), written after each batch Kafka
acknowledged: reading it back is one local read, where resuming from the input topic would mean
scanning every partition for this watcher's last events. A crash between the acknowledgement and
the write republishes one batch, whose deterministic event ids the detector counts once.

While Kafka is unreachable (a broker restart), a batch waits for its acknowledgement and the watch
waits with it, for as long as the producer keeps the events (librdkafka's `message.timeout.ms`),
as the adapters' sinks and the detector wait: the store keeps its history meanwhile. Only a batch
Kafka refused, or one still waiting at a stop, ends the watcher; then neither the state file nor
the watcher's memory counts it, so a restart publishes it again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from prometheus_client import start_http_server

from detector.cli.arguments import port, positive_seconds
from detector.contracts.topics import INPUT_TOPIC
from detector.errors import ExitCode, InputError, SplitbrainError
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.kafka.emit import DEFAULT_FLUSH_TIMEOUT, DeliveryError, Emitter

log = logging.getLogger("splitbrain.watch")

RETRY_MAX_S: Final = 5.0
STOP_CHECK_S: Final = 1.0  # how soon a follower waiting for Kafka sees a stop


class Publisher:
    """Publishes a watcher's events and, once Kafka acknowledged them, saves its state."""

    def __init__(
        self,
        emitter: Emitter,
        state_file: Path | None,
        section: str,
        state: Callable[[], Any],
        *,
        wait_s: float = DEFAULT_FLUSH_TIMEOUT,
    ) -> None:
        self._emitter = emitter
        self._state_file = state_file
        self._section = section
        self._state = state
        self._wait_s = wait_s  # between two warnings that Kafka has not acknowledged a batch
        self._lock = threading.Lock()

    def load(self) -> Mapping[str, Any]:
        """The section a previous run saved; empty on a first run."""
        if self._state_file is None or not self._state_file.exists():
            return {}
        saved = json.loads(self._state_file.read_text())
        section = saved.get(self._section, {}) if isinstance(saved, dict) else {}
        return section if isinstance(section, dict) else {}

    def publish(
        self,
        batch: Iterable[Mapping[str, Any]] | Callable[[], Iterable[Mapping[str, Any]]],
        *,
        save: bool = True,
        stop: threading.Event | None = None,
        undo: Callable[[], None] | None = None,
    ) -> None:
        """Send the events, wait for every acknowledgement, then save (raises `DeliveryError`).

        `batch` may be a function that makes the events (a watch response applied to the
        watcher's memory): it runs under the lock that saves, so no other follower saves a state
        that already counts events not yet acknowledged. If making or sending them fails,
        `undo` puts the watcher's memory back as it was before, and nothing is saved.

        A Kafka outage is waited out (a warning every `wait_s` seconds): Kafka refusing an event
        raises at once, and so does a batch still unacknowledged at the end of a wait once
        `stop` is set."""
        with self._lock:
            try:
                events = list(batch() if callable(batch) else batch)
                for event in events:
                    self._emitter.emit(event)
                if events:
                    self._wait(len(events), stop)
                    for event in events:
                        log.info(
                            "published %s epoch=%s seq=%s",
                            event["kind"],
                            event["owner_epoch"],
                            event.get("seq"),
                        )
            except BaseException:
                if undo is not None:
                    undo()
                raise
            if save and self._state_file is not None:
                tmp = self._state_file.with_name(self._state_file.name + ".tmp")
                tmp.write_text(json.dumps({self._section: self._state()}))
                os.replace(tmp, self._state_file)

    def _wait(self, count: int, stop: threading.Event | None) -> None:
        """Until Kafka acknowledged every event: in slices of at most `STOP_CHECK_S`, so that a
        stop is seen while Kafka is away; a warning after each `wait_s`."""
        waited = warned = 0.0
        while True:
            slice_s = min(self._wait_s, STOP_CHECK_S)
            try:
                self._emitter.flush(slice_s)
                return
            except DeliveryError as exc:
                if exc.failures or (stop is not None and stop.is_set()):
                    raise
                waited += slice_s
                if waited - warned >= self._wait_s:
                    warned = waited
                    log.warning(
                        "Kafka has not acknowledged %d of %d event(s) in %gs; waiting for it "
                        "(the watch goes on once it has)",
                        exc.pending,
                        count,
                        waited,
                    )


class Follower(threading.Thread):
    """Runs one watch loop until it fails for good; retries what can be retried."""

    def __init__(self, name: str, loop: Callable[[threading.Event], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._loop = loop
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        delay = 0.5
        while not self.stop.is_set():
            try:
                self._loop(self.stop)
                delay = 0.5
            except DeliveryError as exc:  # Kafka did not take the events: do not go on
                self.error = exc
                return
            except Exception as exc:
                log.warning(
                    "%s: watch interrupted (%s: %s); retrying", self.name, type(exc).__name__, exc
                )
                self.stop.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)


def _serve(followers: list[Follower], publisher: Publisher) -> int:
    """Start the followers and wait for SIGTERM/SIGINT or the first one to fail."""
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for f in followers:
        f.start()
    while not done.wait(0.2):
        failed = [f for f in followers if not f.is_alive()]
        if failed:
            raise SplitbrainError(f"{failed[0].name}: {failed[0].error}") from failed[0].error
    for f in followers:
        f.stop.set()
    publisher.publish([], save=True)
    return ExitCode.OK


class _Resumable(Protocol):
    """A watcher as `_watch` uses it: its state to save, and a saved one to resume from."""

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


@contextlib.contextmanager
def _extra(name: str) -> Iterator[None]:
    """Imports of a store's client library, an extra of the package: when one is missing, say
    which extra to install."""
    try:
        yield
    except ImportError as exc:
        raise InputError(
            f"{exc.name} is missing: pip install 'splitbrain-detector[{name}]'"
        ) from None


def _watch(
    args: argparse.Namespace,
    kafka: dict[str, Any],
    system: str,
    watcher: _Resumable,
    followers: Callable[[Publisher], list[Follower]],
    following: str,
) -> int:
    """What every watcher does around its loops: publish through one `Emitter`, resume from
    the state file, serve /metrics if asked, say what it follows, and serve the `followers`
    (made with the publisher) until SIGTERM or the first failure."""
    with Emitter(kafka, topic=args.topic) as emitter:
        publisher = Publisher(emitter, args.state_file, system, watcher.state)
        watcher.restore(publisher.load())
        if args.metrics_port:
            start_http_server(args.metrics_port, addr="127.0.0.1")
        print(f"splitbrain watch {system}: following {following}", file=sys.stderr, flush=True)
        return _serve(followers(publisher), publisher)


# ---- etcd ---------------------------------------------------------------------------------


def _etcd_client(endpoint: str) -> Any:
    from etcd3gw.client import Etcd3Client  # noqa: PLC0415  (the etcd extra)

    url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    return Etcd3Client(
        host=url.hostname or "127.0.0.1",
        port=url.port or 2379,
        protocol=url.scheme or "http",
        timeout=10,
    )


def run_etcd(args: argparse.Namespace) -> int:
    kafka = KafkaConnection.from_args(args).client_config()
    with _extra("etcd"):
        from detector.adapters import _etcd_watch as gateway  # noqa: PLC0415
        from detector.adapters._watch import WatchMetrics  # noqa: PLC0415
        from detector.adapters.etcd import LockWatcher  # noqa: PLC0415
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    clients = [_etcd_client(e) for e in args.endpoints]
    current = [0]

    def client() -> Any:
        return clients[current[0] % len(clients)]

    watcher = LockWatcher(
        args.prefix, lambda lease: gateway.lease_ttl(client(), lease), WatchMetrics("etcd")
    )

    def follow(publisher: Publisher, prefix: str) -> Callable[[threading.Event], None]:
        def loop(stop: threading.Event) -> None:
            unit = watcher.units[prefix]

            def publish(make: Callable[[], list[dict[str, Any]]]) -> None:
                before: dict[str, Any] = {}

                def made() -> list[dict[str, Any]]:
                    # Under the publisher's lock, where every follower changes its memory: the
                    # prefix as Kafka last acknowledged it, for a batch that fails.
                    before[prefix] = watcher.state()[prefix]
                    return make()

                publisher.publish(made, stop=stop, undo=lambda: watcher.restore(before))

            try:
                if unit.revision == 0:
                    revision, kvs, invalid = gateway.list_prefix(client(), prefix)
                    publish(partial(watcher.relist, prefix, revision, kvs, invalid, reason="start"))
                for response in gateway.watch_prefix(
                    client(), prefix, unit.revision + 1, timeout=args.idle_timeout
                ):
                    if response.compact_revision:
                        watcher.compacted(prefix, response)
                        revision, kvs, invalid = gateway.list_prefix(client(), prefix)
                        publish(
                            partial(
                                watcher.relist, prefix, revision, kvs, invalid, reason="compacted"
                            )
                        )
                        return
                    publish(partial(watcher.apply, prefix, response))
                    if stop.is_set():
                        return
            except (OSError, ConnectionError):
                current[0] += 1  # the next endpoint, if there are several
                raise

        return loop

    return _watch(
        args,
        kafka,
        "etcd",
        watcher,
        lambda publisher: [Follower(f"etcd {p}", follow(publisher, p)) for p in args.prefix],
        f"{len(args.prefix)} prefix(es) on {', '.join(args.endpoints)}",
    )


# ---- Kubernetes ---------------------------------------------------------------------------


def run_kubernetes(args: argparse.Namespace) -> int:
    kafka = KafkaConnection.from_args(args).client_config()
    with _extra("kubernetes"):
        from kubernetes import client as kube_client  # noqa: PLC0415
        from kubernetes import config as kube_config  # noqa: PLC0415

        from detector.adapters import _kube_watch as api_server  # noqa: PLC0415
        from detector.adapters._watch import WatchMetrics  # noqa: PLC0415
        from detector.adapters.kubernetes import LeaseWatcher, feed, lease_key  # noqa: PLC0415
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        if args.kubeconfig is not None:
            kube_config.load_kube_config(config_file=str(args.kubeconfig))  # type: ignore[no-untyped-call]
        else:
            kube_config.load_config()  # type: ignore[no-untyped-call]
    except (kube_config.ConfigException, OSError) as exc:
        raise InputError(f"--kubeconfig: {exc}") from None
    api = kube_client.CoordinationV1Api()
    names = {lease_key(args.namespace, name) for name in args.lease or ()}
    watcher = LeaseWatcher(lambda key: not names or key in names, WatchMetrics("kubernetes"))
    record = args.record.open("a") if args.record is not None else None

    def follow(publisher: Publisher) -> list[Follower]:
        def loop(stop: threading.Event) -> None:
            if not watcher.resource_version or watcher.gone:
                reason = "gone" if watcher.gone else "start"
                source: Iterable[dict[str, Any]] = [
                    api_server.list_leases(api, args.namespace, args.selector, reason=reason)
                ]
            else:
                source = api_server.watch_leases(
                    api,
                    args.namespace,
                    args.selector,
                    watcher.resource_version,
                    timeout_s=max(int(args.idle_timeout), 1),
                )
            for event in source:
                if record is not None:
                    record.write(json.dumps(event) + "\n")
                    record.flush()
                publisher.publish(partial(feed, watcher, [event]), stop=stop)
                if watcher.gone or stop.is_set():
                    return

        return [Follower(f"kubernetes {args.namespace}", loop)]

    try:
        return _watch(
            args, kafka, "kubernetes", watcher, follow, f"leases in namespace {args.namespace}"
        )
    finally:
        if record is not None:
            record.close()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "watch",
        help="publish a coordination store's lease holders (etcd, Kubernetes) as events",
        description="Follow lock, election or Lease objects and publish each holder change to "
        "the input topic, ordered by the store's revision. Runs until SIGTERM; exit 1 when "
        "Kafka does not take the events, 2 when a flag or the cluster cannot be used.",
    )
    systems = p.add_subparsers(dest="system", required=True, metavar="SYSTEM")
    etcd = systems.add_parser(
        "etcd",
        help="etcd locks and elections (etcd3gw Lock, Mutex, Election)",
        description="Each --prefix is one lock or election: its holder is the key with the "
        "lowest create_revision (the epoch); seq is the revision of the change.",
    )
    etcd.add_argument(
        "--endpoints",
        action="append",
        required=True,
        metavar="URL",
        help="etcd client URL, e.g. http://127.0.0.1:2379 (repeatable: tried in turn)",
    )
    etcd.add_argument(
        "--prefix",
        action="append",
        required=True,
        metavar="KEY",
        help="a lock's key or an election's prefix; the workflow key of its events (repeatable)",
    )
    _common(etcd)
    etcd.set_defaults(run=run_etcd)
    kube = systems.add_parser(
        "kubernetes",
        help="coordination.k8s.io/v1 Leases (client-go and Python leader election)",
        description="Each Lease is one workflow (namespace/name). Epoch: leaseTransitions where "
        "the writer keeps it (client-go), else the acquiring write's resourceVersion; seq is "
        "the object's resourceVersion.",
    )
    kube.add_argument("--namespace", required=True, metavar="NS", help="the Leases' namespace")
    kube.add_argument(
        "--lease",
        action="append",
        metavar="NAME",
        help="a Lease to follow (repeatable; default: every Lease --selector lets through)",
    )
    kube.add_argument("--selector", metavar="LABELS", help="a label selector for the Leases")
    kube.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    kube.add_argument(
        "--record",
        type=Path,
        metavar="PATH",
        help="append every list and watch event the API server sent, as JSON lines (for replay)",
    )
    _common(kube)
    kube.set_defaults(run=run_kubernetes)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-file",
        type=Path,
        metavar="PATH",
        help="where the watcher records how far it published, to resume there after a restart "
        "(default: none, every start relists)",
    )
    p.add_argument(
        "--topic", default=INPUT_TOPIC, metavar="NAME", help="the topic events are published to"
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus /metrics on 127.0.0.1:PORT",
    )
    p.add_argument(
        "--idle-timeout",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="reconnect a watch that said nothing for S seconds (default: 60)",
    )
    add_kafka_arguments(p)
