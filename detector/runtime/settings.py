"""What a detector worker needs to know, whichever runtime runs it: each setting declared once."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field

from detector.contracts.topics import (
    DLQ_TOPIC,
    FINDINGS_TOPIC,
    GROUP_ID,
    INPUT_TOPIC,
    changelog_topic,
)
from detector.core import Config
from detector.settings import (
    MAX_INT,
    Directory,
    Form,
    IpAddress,
    LogLevel,
    Name,
    PortOrOff,
    PositiveInt,
    SecondsOrOff,
)

# Which `detector.runtime.store.Store` a worker keeps its workflow states in.
StoreKind = Literal["memory", "rocksdb"]
Guarantee = Literal["exactly-once", "at-least-once"]
# Which input partitions a member of the kafka runtime keeps warm (`detector.runtime.standby`).
StandbyKind = Literal["off", "all"]
# Short, as Kafka Streams sets it under exactly-once: a transaction that a killed worker left open
# holds the next owner of its partitions (their committed offsets and their restore) until then.
TRANSACTION_TIMEOUT_MS: Final = 10_000
# librdkafka keeps its socket timeout 100 ms under the transaction timeout: 1 s leaves it room.
TransactionTimeoutMs = Annotated[
    int, Field(ge=1000, le=MAX_INT), Form(f"milliseconds from 1000 to {MAX_INT}", "MS")
]
# Kafka's rule for a group.instance.id; the transactional id and the state directory take it too.
_INSTANCE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _instance_id(text: str) -> str:
    if text in (".", "..") or not _INSTANCE_ID.fullmatch(text):
        raise ValueError("not an instance id")
    return text


InstanceId = Annotated[
    str,
    AfterValidator(_instance_id),
    Form("1 to 249 letters, digits, '.', '_' or '-' (not . or ..)", "NAME"),
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """The one declaration of the worker's own settings: a field with a default is also a
    `splitbrain worker` flag and a `SPLITBRAIN_` variable, checked by its type, its description
    the flag's help and the configuration reference (`detector.cli.worker` makes them from here).
    The engine's settings are declared in `Config` the same way; `kafka` (the librdkafka client
    config of `detector.kafka.config`) and `engine` are built from the command's other settings.
    """

    runtime: Annotated[
        Literal["kafka", "faust"],
        Field(description="stream runtime: kafka (confluent-kafka transactions) or faust"),
    ] = "kafka"
    group_id: Annotated[
        Name, Field(description="consumer group; also names the changelog topic")
    ] = GROUP_ID
    # Part of the transactional id: a restarted worker fences its own previous incarnation at once
    # instead of waiting for a timeout.
    instance_id: Annotated[
        InstanceId,
        Field(
            description="stable name of this worker slot: the transactional id's suffix (a "
            "restarted worker fences its previous incarnation). Give each worker its own; "
            "default: the host name"
        ),
    ] = field(default_factory=socket.gethostname)
    input_topic: Annotated[Name, Field(description="topic of ownership events")] = INPUT_TOPIC
    findings_topic: Annotated[Name, Field(description="topic of finding revisions")] = (
        FINDINGS_TOPIC
    )
    dlq_topic: Annotated[Name, Field(description="topic of dead letters")] = DLQ_TOPIC
    commit_interval_ms: Annotated[
        PositiveInt,
        Field(description="commit the transaction at least this often, in milliseconds"),
    ] = 100
    commit_max_events: Annotated[
        PositiveInt, Field(description="or after this many input records")
    ] = 5000
    # None: a commit waits for ever (`detector.runtime.stall`).
    commit_give_up_s: Annotated[
        SecondsOrOff,
        Field(
            description="kafka runtime: a commit that has waited for Kafka this long ends the "
            "worker (status 1) for its supervisor to start a fresh one, which looks the "
            "coordinators up again (librdkafka can wait for ever on a group coordinator whose "
            "broker is gone for good); nothing is lost or written twice. A commit past its own "
            "30 s timeout while the cluster has served every partition the transaction needs for "
            "20 s ends it sooner. 0: wait for ever. In seconds"
        ),
    ] = 300.0
    transaction_timeout_ms: Annotated[
        TransactionTimeoutMs,
        Field(
            description="kafka runtime, exactly-once: the coordinator aborts a transaction open "
            "this long (Kafka's transaction.timeout.ms). A killed worker's open transaction holds "
            "the next owner of its partitions until then; a batch that cannot commit in time is "
            "aborted and done again. At most the brokers' transaction.max.timeout.ms (15 min by "
            "default). In milliseconds"
        ),
    ] = TRANSACTION_TIMEOUT_MS
    # at-least-once gives up the transactions, and with them the promise that a
    # (finding_id, revision) pair is never written twice.
    processing_guarantee: Annotated[
        Guarantee,
        Field(
            description="exactly-once: one Kafka transaction per batch, so a (finding_id, "
            "revision) pair is never produced twice; at-least-once (kafka runtime only): no "
            "transactions, so a crash or rebalance can produce a pair again, and a worker paused "
            "past its session is not fenced: the stale state it writes on waking can hide a later "
            "finding. Not for paging: it is there to measure what the transactions cost"
        ),
    ] = "exactly-once"
    state_dir: Annotated[Directory, Field(description="local state; created if missing")] = Path(
        "var/state"
    )
    store: Annotated[
        StoreKind,
        Field(
            description="local store of workflow states: memory, or rocksdb on --state-dir "
            "(needs the rocksdb extra); both are rebuilt from the changelog"
        ),
    ] = "memory"
    standby: Annotated[
        StandbyKind,
        Field(
            description="kafka runtime: all keeps a warm copy of every input partition this "
            "worker does not own, read from the changelog as its owner writes it, so that a "
            "takeover reads only the changelog's tail instead of restoring the partition; it "
            "costs the memory of the whole state in every worker and a read of every changelog "
            "write by every worker. off: a worker holds only its own partitions' state"
        ),
    ] = "off"
    metrics_port: Annotated[
        PortOrOff, Field(description="serve /metrics on this port (0: off)")
    ] = 0
    metrics_address: Annotated[
        IpAddress,
        Field(
            description="the address /metrics listens on; 0.0.0.0 (or ::) for a scraper in "
            "another container or host, behind a network policy or firewall"
        ),
    ] = "127.0.0.1"
    log_level: Annotated[LogLevel, Field(description="log level")] = "INFO"
    kafka: dict[str, Any]
    engine: Config

    @property
    def changelog_topic(self) -> str:
        return changelog_topic(self.group_id)

    @property
    def transactional_id(self) -> str:
        return f"{self.group_id}-{self.instance_id}"
