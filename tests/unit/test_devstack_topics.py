"""Creating fresh topics for tests and benches: a request lost with the bootstrap connection is
asked again, and only then does a topic that exists count as created."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from detector.devstack import topics

RETIRED = KafkaError(KafkaError._DESTROY_BROKER, "Broker handle destroyed without termination")
EXISTS = KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "Topic already exists")


class ScriptedAdmin:
    """Answers each `create_topics` call with the next round of errors (None: created)."""

    def __init__(self, rounds: Iterator[dict[str, KafkaError | None]]) -> None:
        self.rounds = rounds
        self.asked: list[list[str]] = []

    def create_topics(self, new: Sequence[NewTopic], **_: Any) -> dict[str, Future[None]]:
        self.asked.append([t.topic for t in new])
        answers = next(self.rounds)
        futures: dict[str, Future[None]] = {}
        for t in new:
            future: Future[None] = Future()
            error = answers[t.topic]
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(error))
            futures[t.topic] = future
        return futures


def scripted(
    monkeypatch: pytest.MonkeyPatch, *rounds: dict[str, KafkaError | None]
) -> ScriptedAdmin:
    admin = ScriptedAdmin(iter(rounds))
    monkeypatch.setattr(topics, "AdminClient", lambda config: admin)
    return admin


def test_a_request_lost_with_the_bootstrap_connection_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker created `a` though its answer was lost; `b` was never asked."""
    admin = scripted(monkeypatch, {"a": RETIRED, "b": RETIRED, "c": None}, {"a": EXISTS, "b": None})
    topics.create_topics({}, [NewTopic(n, 1, 1) for n in "abc"])
    assert admin.asked == [["a", "b", "c"], ["a", "b"]]


def test_a_topic_that_existed_before_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, {"a": EXISTS})
    with pytest.raises(KafkaException, match="already exists"):
        topics.create_topics({}, [NewTopic("a", 1, 1)])


def test_a_second_loss_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = scripted(monkeypatch, {"a": RETIRED}, {"a": RETIRED})
    with pytest.raises(KafkaException, match="destroyed"):
        topics.create_topics({}, [NewTopic("a", 1, 1)])
    assert len(admin.asked) == 2
