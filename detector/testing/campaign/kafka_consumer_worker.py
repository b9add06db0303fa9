"""A campaign worker in a Kafka consumer group: `python -m
detector.testing.campaign.kafka_consumer_worker --redis URL --topic T --group G --work-s S` (the
broker, the sink's topic and the truth log from the environment the campaign gives it).

One confluent-kafka `Consumer` watched by the adapter's `ConsumerWatch`, as a user's loop is:
poll a record, process it (`effect_attempted`, the work, the write), commit its offset. The
orders come by signal (`election.Orders`): SIGTERM stop (finish the record, leave the group),
SIGUSR1 hand off (leave the group, sit out, join again), SIGUSR2 make the next record raise
before its effect (the loop seeks back to it and processes it again).

The ground truth is the group's own assignment. Each `on_assign` writes to Redis, per partition,
the member id the coordinator gave the member it assigned the partition to (only from a later
generation than the one written); each record's write is a Lua script that reads, in the same
atomic step, whether that is still this member's id. A rebalance that leaves the partition with
its member leaves its id there.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Final

import redis
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from detector.adapters import AdapterSink, current, effect_attempted, effect_committed
from detector.adapters.kafka_consumer import ADAPTER, ConsumerWatch, generation
from detector.kafka.config import KafkaConnection
from detector.testing.campaign import election
from detector.testing.campaign.truth import TruthLog
from detector.testing.campaign.worker import sink

log = logging.getLogger("campaign.kafka-consumer")

DESTINATION: Final = "ledger"
SESSION_MS: Final = 6000  # the broker's least (group.min.session.timeout.ms)
# A write this soon after its partition went to another member may reach the detector before the
# successor's acquisition (both are sent by their members' sinks, batched): arrival orders them.
ARRIVAL_S: Final = 0.5
ARRIVAL_BLIND: Final = "arrival_order"

# KEYS: the partition's owner (a hash: member, generation, at). ARGV: the member id, the
# generation. Written only from a later generation.
_ASSIGN: Final = """
if tonumber(ARGV[2]) <= tonumber(redis.call('HGET', KEYS[1], 'generation') or '-1') then
  return 0
end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'member', ARGV[1], 'generation', ARGV[2], 'at', now[1] + now[2] / 1e6)
return 1
"""
# KEYS: the partition's owner, the ledger (effect key -> times written), the records done.
# ARGV: the effect key. Returns {the owner's member id, since when, server seconds, microseconds}.
_WRITE: Final = """
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('SADD', KEYS[3], ARGV[1])
local now = redis.call('TIME')
local owner = redis.call('HMGET', KEYS[1], 'member', 'at')
return {owner[1] or '', owner[2] or '0', now[1], now[2]}
"""


def owner_key(topic: str, partition: int) -> str:
    return f"{topic}:owner:{partition}"


def busy_key(topic: str, index: int) -> str:
    """Lives while member `index` is inside a record's work: where the fleet's pause lands."""
    return f"{topic}:busy:{index}"


def done_key(topic: str) -> str:
    """The records processed (by effect key), for the fleet to know when the run is done."""
    return f"{topic}:done"


@dataclass
class Member:
    client: redis.Redis
    topic: str
    group: str
    index: int  # in the fleet
    work_s: float
    orders: election.Orders = field(default_factory=election.Orders)
    sink: AdapterSink = field(default_factory=lambda: sink(ADAPTER))
    truth: TruthLog | None = field(default_factory=TruthLog.from_env)
    # Partition -> the member id this member had when the group assigned it.
    members: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.config = KafkaConnection.from_env().client_config()
        self._assign = self.client.register_script(_ASSIGN)
        self._write = self.client.register_script(_WRITE)

    def serve(self) -> None:
        """Members of the group, one after another (a handoff leaves and joins again), until
        the stop order."""
        while not self.orders.stopping.is_set():
            if self.orders.sitting_out():
                self.orders.stopping.wait(0.2)
                continue
            self.consume(time.monotonic())

    def consume(self, since: float) -> None:
        consumer = Consumer(
            {
                **self.config,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_MS,
                "max.poll.interval.ms": SESSION_MS,
                "heartbeat.interval.ms": 1000,
            }
        )
        watch = ConsumerWatch(consumer, self.group, sink=self.sink)
        watch.subscribe([self.topic], on_assign=self.assigned)
        try:
            while self.orders.leading(since):
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    self.process(consumer, watch, msg)
        finally:
            watch.close()

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        member, gen = consumer.memberid() or "", generation(consumer)
        for tp in partitions:
            self.members[tp.partition] = member
            self._assign(keys=[owner_key(self.topic, tp.partition)], args=[member, gen or 0])

    def process(self, consumer: Consumer, watch: ConsumerWatch, msg: Message) -> None:
        partition = msg.partition() or 0
        with watch.processing(msg) as key:
            effect_attempted(key, destination=DESTINATION)
            if self.orders.take_failure():
                log.info("%s failed before its effect; processing it again", key)
                consumer.seek(TopicPartition(msg.topic() or "", partition, msg.offset() or 0))
                return
            self.client.set(busy_key(self.topic, self.index), 1, px=int(self.work_s * 1000))
            time.sleep(self.work_s)
            self.write(key, partition)
        try:
            watch.commit(message=msg, asynchronous=False)
        except KafkaException as exc:
            log.info("%s: its commit failed (%s)", key, exc.args[0] if exc.args else exc)

    def write(self, key: str, partition: int) -> None:
        """The record's effect at the ledger, Redis's receipt, and the truth read with it."""
        keys = [owner_key(self.topic, partition), f"{self.topic}:ledger", done_key(self.topic)]
        owner, since, sec, usec = self._write(keys=keys, args=[key])
        effect_committed(key, destination=DESTINATION, by_destination=True)
        ownership = current()
        if self.truth is None or ownership is None:
            return
        at = int(sec) + int(usec) / 1e6
        mine = self.members.get(partition, "")
        owned = _text(owner) == mine
        self.truth.record(
            workflow_key=ownership.workflow_key,
            effect_key=key,
            executor=ownership.worker_id,
            epoch=ownership.owner_epoch,
            evidence=f"partition {partition} assigned to {_text(owner)} at the write; "
            f"this member was {mine}",
            owned=owned,
            blind=None if owned or at - float(since) > ARRIVAL_S else ARRIVAL_BLIND,
            at=at,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--redis", required=True, help="the recording destination")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--index", type=int, required=True, help="the member's index in the fleet")
    p.add_argument("--work-s", type=float, default=0.4, help="how long a record's work takes")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    client = redis.Redis.from_url(args.redis)
    member = Member(client, args.topic, args.group, args.index, args.work_s)
    member.orders.install()
    log.info(election.READY)
    member.serve()
    member.sink.close(5)


if __name__ == "__main__":
    main()
