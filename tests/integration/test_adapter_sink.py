"""The adapters' sink in a real process against a real broker: a process that exits at once
still delivers what its adapters made, within a bound, and counts and logs what it could not;
a process stopped and continued (SIGSTOP, SIGCONT) does not call delivered events
unacknowledged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from detector.devstack.kafka import LocalKafka
from detector.devstack.process import free_port
from detector.devstack.topics import TopicReader
from tests.integration.kafka_harness import (
    TIMEOUT,
    broker_env,
    create_topic,
    delete_topics,
    unique,
)

REPO = Path(__file__).resolve().parents[2]
COUNT = 500
BOUND_S = 2.0  # SPLITBRAIN_ADAPTER_EXIT_FLUSH_S of the unreachable case
SLACK_S = 3.0  # beyond the bound: the interpreter's own exit, a loaded machine

# Makes `count` events of its own and those of a forked child (`fork`), then exits at once.
EXITING = textwrap.dedent(
    """
    import logging, os, sys
    from detector.adapters import AdapterSink
    from detector.contracts.events import Kind
    from detector.kafka.emit import Emitter

    topic, count, fork = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "fork"
    logging.basicConfig(level=logging.WARNING)
    sink = AdapterSink("exiting", publisher=lambda: Emitter.from_env(topic=topic))

    def send(who):
        for i in range(count):
            sink.send(Kind.HEARTBEAT, workflow_key=f"{who}-{i}", owner_epoch=1, worker_id=who)

    send("parent")
    if fork:
        child = os.fork()
        if child == 0:
            send("child")
            sys.exit(0)  # the child's own exit flushes the child's events
        os.waitpid(child, 0)
    print("queued", flush=True)
    """
)

# One event, published by an emitter that holds it 500 ms (linger.ms) and says when the sink's
# wait for its acknowledgement begins; the sink waits 1 s for acknowledgements. A first event
# warms the producer up (its producer id: a young broker may take seconds to give one).
PAUSED = textwrap.dedent(
    """
    import logging, sys
    from detector.adapters import AdapterSink, _sink
    from detector.contracts.events import Kind
    from detector.kafka.config import KafkaConnection
    from detector.kafka.emit import Emitter

    logging.basicConfig(level=logging.WARNING)

    class Watched:
        armed = False

        def __init__(self, producer):
            self._producer = producer

        def __len__(self):
            return len(self._producer)

        def poll(self, timeout):
            if timeout > 0 and Watched.armed:
                Watched.armed = False
                print("waiting", flush=True)
            return self._producer.poll(timeout)

        def __getattr__(self, name):
            return getattr(self._producer, name)

    def emitter():
        config = KafkaConnection.from_env().client_config()
        made = Emitter({**config, "linger.ms": 500}, topic=sys.argv[1])
        made._producer = Watched(made._producer)
        return made

    sink = AdapterSink("paused", publisher=emitter)
    if sys.argv[2] == "warm":
        _sink._SETTLE_S = 60.0
        sink.send(Kind.HEARTBEAT, workflow_key="warm-up", owner_epoch=1, worker_id="paused")
        assert sink.flush(90)
    _sink._SETTLE_S = 1.0
    Watched.armed = True
    sink.send(Kind.HEARTBEAT, workflow_key="paused-0", owner_epoch=1, worker_id="paused")
    print("flushed" if sink.flush(30) else "not flushed", flush=True)
    """
)


@pytest.fixture
def topic(kafka_broker: LocalKafka) -> Iterator[str]:
    name = create_topic(kafka_broker, unique("sink"), 3)
    try:
        yield name
    finally:
        delete_topics(kafka_broker, [name])


def start(script: str, env: Mapping[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env={**env, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def line_of(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def finish(process: subprocess.Popen[str]) -> str:
    """The process's exit status checked, its stderr."""
    _, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    return err


def keys(broker: LocalKafka, topic: str, expected: int) -> list[str]:
    """The workflow keys on `topic`, read_committed, once `expected` records are there (or
    the timeout)."""
    with TopicReader(broker.client_config(), topic) as reader:
        deadline = time.monotonic() + TIMEOUT
        while len(reader.records) < expected and time.monotonic() < deadline:
            reader.poll(0.5)
        return sorted(r.key.decode() for r in reader.records if r.key is not None)


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("fork", ["once", "fork"])
def test_a_process_that_exits_at_once_delivers_every_event(
    kafka_broker: LocalKafka, topic: str, fork: str
) -> None:
    """The events of a script that ends as soon as it made them, and of a child it forked
    (Celery's prefork pool is one), all reach Kafka: the exit waits for them."""
    process = start(EXITING, broker_env(kafka_broker), topic, str(COUNT), fork)
    assert line_of(process) == "queued"
    err = finish(process)
    assert "at exit" not in err
    who = ["parent", "child"] if fork == "fork" else ["parent"]
    expected = sorted(f"{w}-{i}" for w in who for i in range(COUNT))
    assert keys(kafka_broker, topic, len(expected)) == expected


def test_an_unreachable_broker_costs_the_exit_its_bound_and_the_events_are_counted(
    kafka_broker: LocalKafka,
) -> None:
    env = broker_env(
        kafka_broker,
        SPLITBRAIN_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",  # nothing listens
        SPLITBRAIN_ADAPTER_EXIT_FLUSH_S=f"{BOUND_S:g}",
    )
    process = start(EXITING, env, "anywhere", str(COUNT), "once")
    assert line_of(process) == "queued"
    queued = time.monotonic()
    err = finish(process)
    assert time.monotonic() - queued < BOUND_S + SLACK_S
    assert (
        f"adapter exiting: {COUNT} event(s) not sent at exit: Kafka did not take them within "
        f"{BOUND_S:g}s (SPLITBRAIN_ADAPTER_EXIT_FLUSH_S); counted as dropped, reason exit"
    ) in err
    assert "parent-" not in err  # no event's content


def test_a_process_paused_past_the_wait_does_not_call_delivered_events_unacknowledged(
    kafka_broker: LocalKafka, topic: str
) -> None:
    """SIGSTOP while the sink waits (1 s) for the acknowledgement of an event, SIGCONT after
    2.5 s: the acknowledgement is read when the process runs again, and nothing is called
    unacknowledged."""
    process = start(PAUSED, broker_env(kafka_broker), topic, "warm")
    assert line_of(process) == "waiting"
    os.kill(process.pid, signal.SIGSTOP)
    deadline = time.monotonic() + TIMEOUT
    while not stopped(process.pid):
        assert time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.01)
    stopped_at = time.monotonic()
    time.sleep(2.5)  # the pause itself: longer than the sink's wait
    os.kill(process.pid, signal.SIGCONT)
    assert line_of(process) == "flushed"
    err = finish(process)
    assert time.monotonic() - stopped_at >= 2.5
    assert "not acknowledged" not in err, err
    assert "did not take" not in err
    assert keys(kafka_broker, topic, 2) == ["paused-0", "warm-up"]


def test_events_a_broker_never_acknowledges_are_still_reported(kafka_broker: LocalKafka) -> None:
    env = broker_env(
        kafka_broker,
        SPLITBRAIN_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        SPLITBRAIN_ADAPTER_EXIT_FLUSH_S="1",
    )
    process = start(PAUSED, env, "anywhere", "cold")
    assert line_of(process) == "waiting"
    assert line_of(process) == "flushed"
    err = finish(process)
    assert (
        "adapter paused: Kafka did not take events (1 event(s) not acknowledged within 1s)" in err
    )
    assert "adapter paused: 1 event(s) not sent at exit" in err


# A LangGraph service's one-off job: one run on a thread, then the process ends at once, with
# neither `checkpointer.flush()` nor the ledger closed.
LANGGRAPH_JOB = textwrap.dedent(
    """
    import sys
    from langgraph.checkpoint.postgres import PostgresSaver
    from detector.adapters import AdapterSink
    from detector.adapters.langgraph import PostgresThreads, SplitbrainCheckpointer
    from detector.demos.langgraph_graph import build, thread
    from detector.kafka.emit import Emitter

    dsn, topic = sys.argv[1], sys.argv[2]
    sink = AdapterSink("langgraph", publisher=lambda: Emitter.from_env(topic=topic))
    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        threads = PostgresThreads(dsn)
        threads.setup()
        checkpointer = SplitbrainCheckpointer(saver, threads=threads, sink=sink, worker_id="job")
        config = thread("ticket-1", "job")
        with checkpointer.run(config):
            build(checkpointer, interrupt=False).invoke({"notes": []}, config)
    print("queued", flush=True)
    """
)


def test_a_langgraph_job_that_exits_at_once_delivers_its_run_to_the_release(
    kafka_broker: LocalKafka, topic: str, postgres_dsn: str
) -> None:
    """The issue's short-lived LangGraph process: its ledger's records become events at exit,
    and every one reaches Kafka, the `lease_released` too."""
    pytest.importorskip("langgraph", reason="the langgraph extra is not installed (.[langgraph])")
    process = start(LANGGRAPH_JOB, broker_env(kafka_broker), postgres_dsn, topic)
    assert line_of(process) == "queued"
    err = finish(process)
    assert "at exit" not in err
    with TopicReader(kafka_broker.client_config(), topic) as reader:
        deadline = time.monotonic() + TIMEOUT
        while not any(b'"lease_released"' in r.value for r in reader.records):
            assert time.monotonic() < deadline, [r.value for r in reader.records]
            reader.poll(0.5)
        reader.poll(0.5)
        kinds = [json.loads(r.value)["kind"] for r in reader.records]
    assert kinds[0] == "lease_acquired" and kinds[-1] == "lease_released", kinds
    assert set(kinds[1:-1]) == {"progress"} and len(kinds) >= 5, kinds
