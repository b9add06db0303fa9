"""`splitbrain demo --source kafka-consumer`: a consumer past `max.poll.interval.ms` finishes its
batch after the group gave its partition to another member.

Two members of one consumer group, on the demo's own broker, each watched by `ConsumerWatch`.
Member A polls the order `pay-0` and stalls (a slow batch) past its 6 s `max.poll.interval.ms`:
librdkafka leaves the group for it, and member B is assigned the partition at the next
generation, reprocesses `pay-0` and charges it. A then finishes its batch and charges `pay-0`
again; only its offset commit fails.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from detector.demos import DemoStack
from detector.demos._common import ThreadedDemo

GROUP: Final = "payments"
SLOW: Final = {"max.poll.interval.ms": 6000, "session.timeout.ms": 6000}


class KafkaConsumerDemo(ThreadedDemo):
    name = "kafka-consumer"

    def missing(self) -> str | None:
        return None  # confluent-kafka is the detector's own, and the broker the demo's

    def start(self, stack: DemoStack) -> None:
        self._run(stack, self._zombie, stack.bootstrap_servers)

    def _zombie(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer, KafkaException, Producer  # noqa: PLC0415
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # noqa: PLC0415

        from detector.adapters import effect_committed  # noqa: PLC0415
        from detector.adapters.kafka_consumer import ConsumerWatch, generation  # noqa: PLC0415
        from detector.devstack.topics import create_topics  # noqa: PLC0415

        say = self._said.append
        client: dict[str, Any] = {"bootstrap.servers": bootstrap}
        sink = self._open_sink("kafka-consumer", bootstrap)
        topic = f"orders-{uuid.uuid4().hex[:6]}"
        group = f"{GROUP}-{uuid.uuid4().hex[:6]}"
        create_topics(client, [NewTopic(topic, 1, 1)], 60)
        producer = Producer(client)
        producer.produce(topic, b"pay-0")
        producer.flush(30)

        def member(name: str) -> tuple[Any, ConsumerWatch]:
            consumer = Consumer(
                {
                    **client,
                    "group.id": group,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    **SLOW,
                }
            )
            return consumer, ConsumerWatch(consumer, group, sink=sink, worker_id=name)

        def first_record(consumer: Any) -> Any:
            while True:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    return msg

        a, watch_a = member("member-A")
        watch_a.subscribe([topic])
        got_a = first_record(a)
        say(
            f"member A got {topic}/0 at generation {generation(a)} and polled pay-0; "
            "its batch stalls past max.poll.interval.ms (6s)"
        )
        b, watch_b = member("member-B")
        watch_b.subscribe([topic])
        got_b = first_record(b)
        say(f"member B got {topic}/0 at generation {generation(b)} after A left the group")
        with watch_b.processing(got_b) as key:
            effect_committed(key, destination="payments-db")
        watch_b.commit(message=got_b, asynchronous=False)
        say(f"member B charged pay-0 ({key}) and committed its offset")
        with watch_a.processing(got_a) as key:
            effect_committed(key, destination="payments-db")
        say(f"member A finished its batch and charged pay-0 ({key}) again")
        try:
            watch_a.commit(message=got_a, asynchronous=False)
        except KafkaException as exc:
            say(f"member A's commit failed ({exc.args[0].name()}): only now does it know")
        a.close()
        watch_b.close()
        sink.flush(30)


def source() -> KafkaConsumerDemo:
    return KafkaConsumerDemo()
