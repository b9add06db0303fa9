"""Reads the findings topic from its start into a `FindingsStore`, in a thread of its own.

It uses `tail`'s consumer (read_committed, every partition assigned, no group joined), with
partition EOF events on: the store is caught up once every partition reported its end, which
is when `/healthz` turns ready.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError

from detector.kafka.findings import POLL_INTERVAL, findings_consumer
from detector.view.store import FindingsStore

log = logging.getLogger(__name__)
JOIN_TIMEOUT: Final = 10.0


class FindingsReader:
    def __init__(self, kafka: dict[str, Any], topic: str, store: FindingsStore) -> None:
        # Opened here, so that an unreadable topic or cluster stops the command before it serves.
        self._consumer: Consumer = findings_consumer(
            {**kafka, "enable.partition.eof": True}, topic, from_beginning=True
        )
        self._partitions = {tp.partition for tp in self._consumer.assignment()}
        self._store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="findings-reader", daemon=True)
        if not self._partitions:
            store.caught_up = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT)

    def _run(self) -> None:
        at_end: set[int] = set()
        try:
            while not self._stop.is_set():
                msg = self._consumer.poll(POLL_INTERVAL)
                if msg is None:
                    continue
                err = msg.error()
                if err is None:
                    self._store.add(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                    if at_end >= self._partitions:
                        self._store.caught_up = True
                elif err.fatal():
                    self._store.failure = f"Kafka: {err.str()}"
                    log.error("reading findings stopped: %s", err.str())
                    return
                else:
                    log.warning("reading findings: %s", err.str())
        except Exception as exc:  # the view goes on serving what it has, and says so
            self._store.failure = f"reader: {exc}"
            log.exception("reading findings stopped")
        finally:
            self._consumer.close()
