"""A real, local, multi-node Apache Kafka cluster (KRaft) for development and fault tests.

Why this exists: the product's default topics (replication 3, `min.insync.replicas` 2) and the
faults of a real cluster (a partition's leader moving mid-transaction, the death of a worker's
transaction coordinator, a follower leaving the ISR, a rolling restart) need more than one
broker. Each node is a `LocalKafka` (a combined broker + controller JVM from the same Maven jars)
with its own data directory, `broker-<id>` under the cluster's, and the cluster's shape (node
ids and ports, the cluster id) is chosen once and saved in `cluster.json`, so a node killed with
`kill -9` comes back with the same identity, and a separate process (`dev kafka stop`) can stop
them all by PID.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypedDict

from confluent_kafka.admin import AdminClient

from detector.devstack.kafka import (
    ClientConfig,
    DevKafkaError,
    KafkaStatus,
    LocalKafka,
    Seat,
    new_cluster_id,
)
from detector.devstack.process import free_port

CLUSTER_FILE: Final = "cluster.json"
CLUSTER_HEAP_MB: Final = 256  # three JVMs on a developer's laptop (or a CI runner)
TRANSACTION_STATE_PARTITIONS: Final = 5  # `transaction.state.log.num.partitions` of every node
OFFSETS_PARTITIONS: Final = 5  # `offsets.topic.num.partitions` of every node


class _Node(TypedDict):
    id: int
    broker_port: int
    controller_port: int


class _Shape(TypedDict):
    cluster_id: str
    nodes: list[_Node]


def is_cluster(data_dir: Path | str) -> bool:
    """Whether `data_dir` holds a multi-node cluster (as opposed to a single broker)."""
    return (Path(data_dir) / CLUSTER_FILE).is_file()


def open_kafka(data_dir: Path | str, start_timeout: float = 90.0) -> LocalKafka | LocalKafkaCluster:
    """The broker or the cluster that `data_dir` holds, to manage it (stop, status)."""
    if is_cluster(data_dir):
        return LocalKafkaCluster(data_dir, start_timeout=start_timeout)
    return LocalKafka(data_dir, start_timeout=start_timeout)


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode` (UTF-16 code units), which Kafka hashes a transactional id with
    to choose its `__transaction_state` partition, and so its coordinator."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h


class LocalKafkaCluster:
    """`brokers` KRaft nodes, each broker and controller, on loopback; internal topics at the
    production settings (replication factor 3, `min.insync.replicas` 2 with three nodes).

    Quacks like `LocalKafka` where the tests and the stack use a broker (`start`, `stop`,
    `bootstrap`, `client_config`, `status`), and adds what fault tests need: a node by id, the
    leader of a partition, the coordinator of a transactional id, waiting for full ISRs.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        brokers: int | None = None,
        heap_mb: int = CLUSTER_HEAP_MB,
        start_timeout: float = 120.0,
        extra_jvm_args: Sequence[str] = (),
    ) -> None:
        """`brokers`: how many nodes a new cluster gets (default 3); an existing one keeps its.
        `heap_mb` and `extra_jvm_args` are each node's, as `LocalKafka` takes them."""
        self.data_dir = Path(data_dir).resolve()
        self.start_timeout = start_timeout
        saved = self._load()
        if saved is None:
            wanted = 3 if brokers is None else brokers
            if wanted < 3:  # two voters lose their quorum with either one
                raise DevKafkaError(f"a cluster needs 3 brokers or more, not {wanted}")
            saved = self._choose(wanted)
        elif brokers is not None and brokers != len(saved["nodes"]):
            raise DevKafkaError(
                f"{self.data_dir} holds a {len(saved['nodes'])}-broker cluster, not {brokers}"
            )
        self._shape = saved
        voters = ",".join(f"{n['id']}@127.0.0.1:{n['controller_port']}" for n in saved["nodes"])
        replication = min(3, len(saved["nodes"]))
        self.nodes: dict[int, LocalKafka] = {
            n["id"]: LocalKafka(
                self.data_dir / f"broker-{n['id']}",
                sasl_ssl=False,
                heap_mb=heap_mb,
                start_timeout=start_timeout,
                extra_jvm_args=extra_jvm_args,
                seat=Seat(
                    node_id=n["id"],
                    broker_port=n["broker_port"],
                    controller_port=n["controller_port"],
                    voters=voters,
                    cluster_id=saved["cluster_id"],
                    replication=replication,
                ),
            )
            for n in saved["nodes"]
        }

    # -- addresses ----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's client listener, comma-separated (clients need only one to be up)."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def sasl_ssl(self) -> bool:
        return False

    def client_config(self) -> ClientConfig:
        return {"bootstrap.servers": self.bootstrap}

    def node(self, node_id: int) -> LocalKafka:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise DevKafkaError(f"no broker {node_id} in {self.data_dir}") from None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> str:
        """Start every node that is not running, then wait until all serve and are registered.

        If the cluster does not come up, kills what this call started and raises.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._save()
        started = []
        try:
            for node in self.nodes.values():
                if node.pid() is None:
                    node.start(wait=False)
                    started.append(node)
            self.wait_ready()
        except BaseException:
            for node in started:
                if node.pid() is not None:
                    node.kill()
            raise
        return self.bootstrap

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until each node answers metadata and every one is registered with the controller."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        for node in self.nodes.values():
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        self.wait_registered(set(self.nodes), max(1.0, deadline - time.monotonic()))

    def wait_registered(self, ids: set[int], timeout: float) -> None:
        """Until the cluster's metadata lists exactly the brokers `ids` (a killed node leaves it
        once its session times out; a restarted one joins when registered)."""
        admin = self._admin()
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            try:
                seen = set(admin.list_topics(timeout=5).brokers)
            except Exception:  # KafkaException while nodes come and go: ask again
                seen = set()
            if seen == ids:
                return
            time.sleep(0.2)
        raise DevKafkaError(f"brokers {sorted(seen)} registered, not {sorted(ids)}, in time")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node by PID (SIGTERM, then SIGKILL), all at once. False if none ran.

        At once, not in turn: a node's clean shutdown waits for the controller quorum to
        acknowledge it, so the last of three stopped in turn waited out `timeout` (two voters
        gone) before its SIGKILL.
        """
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            stopped = list(pool.map(lambda node: node.stop(timeout), self.nodes.values()))
        return any(stopped)

    def restart(self, node_id: int) -> None:
        """Start a stopped or killed node again on its data and ports, and wait until every
        partition has caught up on it, when no other node is down (until then it is a broker
        only on paper)."""
        node = self.node(node_id)
        node.start()
        stopped = self._stopped()
        self.wait_registered(set(self.nodes) - stopped, self.start_timeout)
        if not stopped:  # with another node down, its replicas cannot be in sync
            self.wait_in_sync(timeout=self.start_timeout)

    def rolling_restart(self, timeout: float = 30.0) -> None:
        """What an operator does to upgrade or reconfigure: one node at a time, a clean
        shutdown (leaders move away first), restart, and wait for full ISRs before the next."""
        for node_id in self.nodes:
            self.node(node_id).stop(timeout)
            self.restart(node_id)

    def pids(self) -> dict[int, int | None]:
        return {node_id: node.pid() for node_id, node in self.nodes.items()}

    def pid(self) -> int | None:
        """A running node's PID (None if none runs): `LocalKafka`'s question, for a cluster."""
        return next((pid for pid in self.pids().values() if pid is not None), None)

    def status(self) -> KafkaStatus:
        pid = self.pid()
        return KafkaStatus(
            running=pid is not None,
            pid=pid,
            bootstrap=self.bootstrap,
            sasl_ssl=False,
            data_dir=self.data_dir,
        )

    # -- where things are ---------------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> int:
        """The node id leading `topic`'s `partition` now (-1: none)."""
        metadata = self._admin().list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            raise DevKafkaError(f"{topic}: {metadata.error.str()}")
        return int(metadata.partitions[partition].leader)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating `transactional_id`'s transactions: the leader of the
        `__transaction_state` partition its hash picks (FindCoordinator's answer)."""
        partition = (java_string_hash(transactional_id) & 0x7FFFFFFF) % (
            TRANSACTION_STATE_PARTITIONS
        )
        return self.leader("__transaction_state", partition)

    def group_coordinator(self, group_id: str) -> int:
        """The node coordinating consumer group `group_id`: the leader of the `__consumer_offsets`
        partition its hash picks (FindCoordinator's answer)."""
        partition = (java_string_hash(group_id) & 0x7FFFFFFF) % OFFSETS_PARTITIONS
        return self.leader("__consumer_offsets", partition)

    def wait_topic(self, topic: str, timeout: float = 30.0) -> None:
        """Until every running node's metadata has `topic` with a leader for each partition: a
        new topic reaches the brokers one by one, and a client asking a slow one is told it
        does not exist."""
        deadline = time.monotonic() + timeout
        for node_id, node in self.nodes.items():
            if node.pid() is None:
                continue
            admin = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 3})
            while True:
                try:
                    found = admin.list_topics(topic, timeout=5).topics[topic]
                    if found.error is None and all(
                        p.leader >= 0 for p in found.partitions.values()
                    ):
                        break
                except Exception:  # KafkaException: ask again
                    pass
                if time.monotonic() > deadline:
                    raise DevKafkaError(f"broker {node_id} does not know {topic} in time")
                time.sleep(0.1)

    def under_replicated(self, topics: Iterable[str] | None = None) -> list[str]:
        """`topic[partition]` of every partition whose ISR is short of its replicas."""
        metadata = self._admin().list_topics(timeout=10)
        wanted = set(topics) if topics is not None else set(metadata.topics)
        return [
            f"{name}[{p.id}]"
            for name, topic in metadata.topics.items()
            if name in wanted
            for p in topic.partitions.values()
            if len(p.isrs) < len(p.replicas) or p.leader < 0
        ]

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Until every partition has a leader and all its replicas in the ISR."""
        deadline = time.monotonic() + timeout
        short: list[str] = []
        while time.monotonic() < deadline:
            try:
                short = self.under_replicated()
            except Exception:  # KafkaException: metadata unavailable for a moment
                short = ["(metadata unavailable)"]
            if not short:
                return
            time.sleep(0.5)
        raise DevKafkaError(f"partitions still short of their replicas: {short[:10]}")

    # -- internals ----------------------------------------------------------------------------

    def _stopped(self) -> set[int]:
        return {node_id for node_id, pid in self.pids().items() if pid is None}

    def _admin(self) -> AdminClient:
        return AdminClient({**self.client_config(), "socket.timeout.ms": 5000, "log_level": 3})

    def _choose(self, brokers: int) -> _Shape:
        ports: set[int] = set()
        while len(ports) < 2 * brokers:  # the same free port may be handed out twice
            ports.add(free_port())
        it = iter(sorted(ports))
        nodes: list[_Node] = [
            {"id": i, "broker_port": next(it), "controller_port": next(it)}
            for i in range(1, brokers + 1)
        ]
        return {"cluster_id": new_cluster_id(), "nodes": nodes}

    def _load(self) -> _Shape | None:
        try:
            loaded: _Shape = json.loads((self.data_dir / CLUSTER_FILE).read_text())
        except (OSError, ValueError):
            return None
        return loaded

    def _save(self) -> None:
        (self.data_dir / CLUSTER_FILE).write_text(json.dumps(self._shape, indent=2) + "\n")


AnyKafka = LocalKafka | LocalKafkaCluster
"""What a test or the stack may run on: one broker or a cluster (the same client-side API)."""
