"""The kafka-consumer source: three members of one consumer group (`kafka_consumer_worker`), on
the campaign's own broker, which is also their group's coordinator, each processing the run's
records and writing an effect per record to a ledger in Debian's `redis-server` (see the worker
for the ground truth: the group's assignment, read in the write's own script).

The zombie: a member paused past its session (SIGSTOP inside a record's work) is dropped by the
coordinator, its partition goes to another member, which processes the uncommitted record
again; the paused one wakes, finishes its record and writes it too, and only its commit fails.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from detector.devstack.needs import missing_package, missing_redis_server
from detector.devstack.redis import LocalRedis
from detector.testing.campaign.checker import Grade
from detector.testing.campaign.kills import WHY, Kills
from detector.testing.campaign.nemesis import Fault, Proc, Step
from detector.testing.campaign.source import CampaignEnv, RunEnv
from detector.testing.campaign.sources import _election
from detector.testing.campaign.sources._election import ElectionFleet, python
from detector.testing.campaign.truth import PROCESS_ENV

MODULE: Final = "detector.testing.campaign.kafka_consumer_worker"
PARTITIONS: Final = 3  # one for each member, as the range assignor deals them
RECORDS: Final = 20  # per partition: about 8 s of work for its member
WORK_S: Final = 0.4


def _no_restart(down_s: float) -> None:
    raise ValueError(
        "the group's coordinator is the campaign's broker: its restart is the campaign's"
    )


@dataclass
class _Members:
    """The fleet, whose pauses land inside a record's work (as celery's do): one between a write
    and the send of its event delays only the event, which arrival orders after the successor's
    acquisition (a false alarm the events cannot avoid, named on docs/campaign.md)."""

    fleet: ElectionFleet
    client: Any
    topic: str

    def drain(self, timeout_s: float) -> bool:
        return self.fleet.drain(timeout_s)

    def apply(self, step: Step) -> None:
        if step.fault is Fault.PAUSE_PAST_LEASE:
            from detector.testing.campaign.kafka_consumer_worker import busy_key  # noqa: PLC0415

            deadline = time.monotonic() + WORK_S
            while not self.client.exists(busy_key(self.topic, step.target)):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        self.fleet.apply(step)


@dataclass
class KafkaConsumerSession:
    env: CampaignEnv
    server: LocalRedis

    @contextlib.contextmanager
    def run(self, env: RunEnv) -> Iterator[_Members]:
        import redis  # noqa: PLC0415
        from confluent_kafka import Producer  # noqa: PLC0415
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # noqa: PLC0415

        from detector.devstack.topics import create_topics  # noqa: PLC0415
        from detector.testing.campaign.kafka_consumer_worker import done_key  # noqa: PLC0415

        name = f"campaign-orders-{uuid.uuid4().hex[:8]}-r{env.run}"
        config = dict(env.campaign.kafka)
        create_topics(config, [NewTopic(name, PARTITIONS, 1)], 60)
        producer = Producer(config)
        for partition in range(PARTITIONS):
            for n in range(RECORDS):
                producer.produce(name, f"order-{n}".encode(), partition=partition)
        producer.flush(60)
        client = redis.Redis.from_url(self.server.url)
        argv = python(MODULE, "--redis", self.server.url, "--topic", name, "--group", name)
        members = [
            Proc(
                f"m{i}",
                [*argv, "--work-s", str(WORK_S), "--index", str(i)],
                env.process_env(**{PROCESS_ENV: f"m{i}"}),
                env.workdir / f"m{i}.log",
            )
            for i in range(_election.WORKERS)
        ]

        def done() -> bool:
            return int(client.scard(done_key(name))) >= PARTITIONS * RECORDS

        kills = Kills(env.campaign.outages)
        fleet = ElectionFleet(members, [], [], done, _no_restart, kills, env.truth)
        try:
            for member in members:
                member.start()
            _election.wait_ready(members)
            yield _Members(fleet, client, name)
        finally:
            fleet.close()  # the members' exits marked in the truth too
            client.close()


class KafkaConsumerSource:
    name = "kafka-consumer"
    # No `seq` (offsets order records, not ownership); every write is Redis's own receipt.
    grade = Grade(ordering="arrival", destination_confirms=True)
    blind = MappingProxyType(
        {
            "arrival_order": (
                "a write within half a second of its partition going to another member: both "
                "members' sinks send in batches and the events carry no seq, so the detector may "
                "hear the write before the successor's acquisition (DESIGN: ordered by arrival)"
            ),
            **WHY,
        }
    )
    # No partition: librdkafka connects to the addresses the brokers advertise, which a proxy per
    # member cannot stand in for. No coordinator restart of its own: the coordinator is the
    # campaign's broker, whose restarts the campaign makes. No clock step: librdkafka is the
    # consumer itself here, and under libfaketime a forward step freezes its timed waits.
    faults = frozenset(
        {
            Fault.PAUSE_PAST_LEASE,
            Fault.CRASH_RESTART,
            Fault.GRACEFUL_SHUTDOWN,
            Fault.EXCEPTION_RETRY,
            Fault.HANDOFF,
        }
    )
    holds = MappingProxyType(
        {
            Fault.PAUSE_PAST_LEASE: (7.0, 10.0),  # past the 6 s session and max.poll.interval.ms
            Fault.CRASH_RESTART: (1.0, 4.0),
            Fault.GRACEFUL_SHUTDOWN: (0.5, 2.0),
            Fault.EXCEPTION_RETRY: (0.0, 0.0),
            Fault.HANDOFF: (0.0, 0.0),
        }
    )
    workers = _election.WORKERS
    span_s = 8.0
    steps = 3

    def missing(self) -> str | None:
        lacking = missing_package("redis-lock", "redis") or missing_redis_server()
        return None if lacking is None else f"its ledger {lacking}"

    @contextlib.contextmanager
    def session(self, env: CampaignEnv) -> Iterator[KafkaConsumerSession]:
        with LocalRedis() as server:
            yield KafkaConsumerSession(env, server)


def source() -> KafkaConsumerSource:
    return KafkaConsumerSource()
