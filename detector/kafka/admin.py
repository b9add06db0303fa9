"""The topics file, and the plan that makes a cluster's topics match it.

Declarative and safe to re-run from a deploy pipeline: it creates what is missing, sets drifted
configs back (incrementally, touching only the keys the file names), never deletes, and leaves
partition counts and replication factors alone because changing them is an operation for a human
(more partitions remap keys and break per-workflow order) — it warns and exits 1 instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import Annotated, Any

import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from detector.errors import ExitCode, SplitbrainError
from detector.kafka.config import (
    KafkaClientError,
    describe,
    fetch_metadata,
)

ConfigValue = bool | int | float | str
Count = Annotated[int, Field(ge=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Profile(_Strict):
    partitions: Count | None = None
    replication_factor: Count | None = None
    config: dict[str, ConfigValue] = Field(default_factory=dict)


class _TopicsFile(_Strict):
    partitions: Count
    replication_factor: Count
    topics: dict[str, dict[str, ConfigValue]]
    profiles: dict[str, _Profile] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Drift:
    topic: str
    key: str
    current: str | None
    wanted: str


@dataclass(slots=True)
class Plan:
    create: list[TopicSpec]
    drift: list[Drift]
    warnings: list[str]

    @property
    def empty(self) -> bool:
        return not self.create and not self.drift


class TopicsFileError(SplitbrainError, ValueError):
    """The topics file cannot be used; the message says where and why."""

    exit_code = ExitCode.UNUSABLE


def _kafka_value(value: ConfigValue) -> str:
    """Kafka's spelling of a YAML scalar: booleans are `true`/`false`, numbers as written."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_topics(path: Traversable, profile: str | None = None) -> list[TopicSpec]:
    """The topics of the file (a path, or the bundled file), with the profile's overrides
    applied, in file order."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = _TopicsFile.model_validate(raw)
    except OSError as exc:
        raise TopicsFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TopicsFileError(f"{path}: not YAML: {exc}") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TopicsFileError(f"{path}: {where}: {first['msg']}") from None
    overrides = _Profile()
    if profile is not None:
        if profile not in spec.profiles:
            known = ", ".join(sorted(spec.profiles)) or "none"
            raise TopicsFileError(f"{path}: no profile {profile!r} (profiles: {known})")
        overrides = spec.profiles[profile]
    topics = [
        TopicSpec(
            name=name,
            partitions=overrides.partitions or spec.partitions,
            replication_factor=overrides.replication_factor or spec.replication_factor,
            config={k: _kafka_value(v) for k, v in {**config, **overrides.config}.items()},
        )
        for name, config in spec.topics.items()
    ]
    for topic in topics:
        min_isr = topic.config.get("min.insync.replicas", "1")
        if min_isr.isdigit() and int(min_isr) > topic.replication_factor:
            raise TopicsFileError(
                f"{path}: {topic.name}: min.insync.replicas {min_isr} > replication factor "
                f"{topic.replication_factor}, so every acks=all write would fail"
                + ("" if profile else " (a single-node broker needs --profile local)")
            )
    return topics


def plan(admin: AdminClient, topics: list[TopicSpec], timeout: float) -> Plan:
    """What `apply` would do, read from the cluster without changing it."""
    metadata = fetch_metadata(admin, timeout)
    existing = [t for t in topics if t.name in metadata.topics]
    result = Plan(
        create=[t for t in topics if t.name not in metadata.topics], drift=[], warnings=[]
    )
    for topic in existing:
        partitions = metadata.topics[topic.name].partitions
        if len(partitions) != topic.partitions:
            result.warnings.append(
                f"{topic.name} has {len(partitions)} partitions, the file wants "
                f"{topic.partitions}: not changed (adding partitions remaps keys and breaks "
                "per-workflow order; repartitioning is a migration, not an apply)"
            )
        replicas = len(partitions[0].replicas) if partitions else 0
        if replicas != topic.replication_factor:
            result.warnings.append(
                f"{topic.name} has replication factor {replicas}, the file wants "
                f"{topic.replication_factor}: not changed (that needs a partition reassignment)"
            )
    if not existing:
        return result
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t.name) for t in existing]
    described = _wait(admin.describe_configs(resources, request_timeout=timeout), "describe")
    for topic, resource in zip(existing, resources, strict=True):
        current: dict[str, ConfigEntry] = described[resource]
        for key, wanted in topic.config.items():
            entry = current.get(key)
            value = entry.value if entry is not None else None
            if value != wanted:
                result.drift.append(Drift(topic.name, key, value, wanted))
    return result


def execute(admin: AdminClient, todo: Plan, timeout: float, *, validate_only: bool) -> None:
    """Create the missing topics, then set the drifted configs; raises if any of it failed.

    With `validate_only` the broker checks every request (replication factor against live
    brokers, config names and values) and changes nothing: a dry run that can fail.
    """
    if todo.create:
        new = [
            NewTopic(t.name, t.partitions, t.replication_factor, config=dict(t.config))
            for t in todo.create
        ]
        created = admin.create_topics(
            new, request_timeout=timeout, operation_timeout=timeout, validate_only=validate_only
        )
        _wait(created, "create")
    if todo.drift:
        entries: dict[str, list[ConfigEntry]] = {}
        for d in todo.drift:
            entries.setdefault(d.topic, []).append(
                ConfigEntry(d.key, d.wanted, incremental_operation=AlterConfigOpType.SET)
            )
        resources = [
            ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=configs)
            for name, configs in entries.items()
        ]
        altered = admin.incremental_alter_configs(
            resources, request_timeout=timeout, validate_only=validate_only
        )
        _wait(altered, "alter")


def _wait(futures: Mapping[Any, Future[Any]], what: str) -> dict[Any, Any]:
    """Every future's result, or one error that lists each failure (not only the first)."""
    results: dict[Any, Any] = {}
    failures: list[str] = []
    for key, future in futures.items():
        try:
            results[key] = future.result()
        except KafkaException as exc:
            failures.append(f"{getattr(key, 'name', key)}: {describe(exc)}")
    if failures:
        raise KafkaClientError(f"{what} failed: " + "; ".join(failures))
    return results
