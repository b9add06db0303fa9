"""The two Kafka poms: the project's pinned broker and the slow job's 4.x one, each cached in a
directory of its own and logging through the log4j its Kafka reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.devstack.kafka import JARS_ENV, KAFKA4_POM, jars_dir, kafka_version, uses_log4j2


def test_the_pinned_broker_is_3_9_and_logs_through_log4j_1() -> None:
    assert kafka_version().startswith("3.9.")
    assert not uses_log4j2()


def test_the_kafka4_pom_pins_a_4x_broker_that_logs_through_log4j_2() -> None:
    assert kafka_version(KAFKA4_POM).startswith("4.")
    assert uses_log4j2(KAFKA4_POM)


def test_the_jars_override_moves_the_pinned_brokers_jars_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(JARS_ENV, str(tmp_path))
    assert jars_dir() == tmp_path.resolve()
    assert jars_dir(KAFKA4_POM).name == kafka_version(KAFKA4_POM)
    assert jars_dir(KAFKA4_POM).parent != tmp_path.resolve()
