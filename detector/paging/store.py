"""The bridge's writes to its state topic (`splitbrain.page-state.v1`,
`detector.contracts.page_state`), acknowledged before the offsets they account for are committed.

The topic is checked or created at start and read back on assignment by the stateful-consumer
module (`detector.kafka.stateful`). Writes use an idempotent producer with `acks=all` and are
flushed (acknowledged) before the consumer commits the offsets they account for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, Producer

from detector.kafka.stateful.recovery import StateTopicError


class StateTopic:
    """A finding's state record goes to the partition its revisions are in."""

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        self.config = dict(config)
        self.topic = topic
        self.producer = Producer(
            {
                **self.config,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                # Bounded, so that a broker that is gone ends the bridge (its supervisor restarts
                # it) rather than holding it forever; nothing is committed without the state.
                "message.timeout.ms": 120_000,
            }
        )

    def write(self, items: list[tuple[str, int, bytes | None]]) -> None:
        """Each (finding id, partition, record or None for a tombstone), acknowledged by the
        broker before this returns; a `StateTopicError` if any was not."""
        errors: list[str] = []

        def delivered(err: KafkaError | None, msg: object) -> None:
            if err is not None:
                errors.append(err.str())

        for key, partition, value in items:
            self.producer.produce(
                self.topic,
                key=key.encode(),
                value=value,
                partition=partition,
                on_delivery=delivered,
            )
            self.producer.poll(0)
        while self.producer.flush(1.0) > 0:
            pass  # message.timeout.ms bounds this: an undeliverable record fails in `delivered`
        if errors:
            raise StateTopicError(
                f"{len(errors)} state record(s) not written to {self.topic}: {errors[0]}"
            )

    def close(self) -> None:
        self.producer.flush(10)
