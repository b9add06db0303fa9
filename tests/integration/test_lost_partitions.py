"""Both stateful consumers, the worker and the pager bridge, when their partitions are lost: the
process is paused (SIGSTOP) past its session timeout, another member takes its partitions and
restores their state, then the paused one resumes. It must write and commit nothing for the
partitions it lost, so that every later owner restores the state their new owner wrote.

(The restore and the rebalance themselves are covered for the worker in `test_worker.py` and for
the bridge in `test_page_bridge.py`; both run on `detector.kafka.stateful`.)
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from detector.devstack.kafka import LocalKafka
from detector.devstack.topics import group_offsets
from detector.devstack.worker import WorkerProcess
from detector.testing.pagerduty import PagerDutyReceiver
from tests.integration.deployment import Deployment, audited, wait_for
from tests.integration.test_page_bridge import (
    KEY,
    BridgeProcess,
    critical_findings,
    findings_topic,
    one_group,
    publish,
    settled,
    takes_over_and_resolves,
    until,
)
from tests.integration.test_worker import event, wait_for_audit

LONG_BATCH = ("--commit-interval-ms", "600000", "--commit-max-events", "100000")


def committed(config: Mapping[str, Any], group: str, topic: str) -> int:
    """The group's committed offset of the topic's partition 0 (-1 when there is none)."""
    return group_offsets(AdminClient(dict(config)), group, topic).get(0, -1)


def signal_bridge(bridge: BridgeProcess, sig: signal.Signals) -> None:
    assert bridge.proc is not None
    bridge.proc.send_signal(sig)


def restores(w: WorkerProcess) -> int:
    return w.log.read_text().count("restored partitions")


@pytest.mark.parametrize("deployment", ["kafka"], indirect=True)
@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_a_worker_that_lost_its_partitions_writes_no_state_for_them(
    deployment: Deployment, guarantee: str
) -> None:
    """The paused worker had processed a takeover's first lease; meanwhile its successor
    processed the whole takeover and committed it. Had the paused one committed its batch when
    it resumed (at least once, a revoke commits), its older state of the workflow would be the
    changelog's latest, and a stale event after the takeover would go unseen by whoever restores
    the partition next."""
    key = "lost-wf"
    first, takeover = (
        event("l1", "lease_acquired", key, 17, 1),
        event("l2", "lease_acquired", key, 18, 2),
    )
    stale = event("l3", "progress", key, 17, 3)
    flags = ("--processing-guarantee", guarantee, *LONG_BATCH)
    config, t = deployment.config, deployment.topics
    deployment.publish([(key.encode(), first)], partition=0)
    paused = deployment.worker("paused", *flags)
    wait_for(
        lambda: paused.samples("splitbrain_state_workflows", "partition").get("0") == 1,
        "the first worker to process the first lease (in a batch it does not commit)",
        workers=[paused],
    )
    paused.signal(signal.SIGSTOP)
    try:
        successor = deployment.worker("successor", "--processing-guarantee", guarantee)
        wait_for(
            lambda: "restored partitions [0, 1, 2]" in successor.log.read_text(),
            "the successor to own every partition, once the paused worker's session expired",
            workers=[successor],
        )
        wait_for(lambda: committed(config, t.group, t.input) == 1, "the first lease committed")
        deployment.publish([(key.encode(), takeover)], partition=0)
        wait_for(lambda: committed(config, t.group, t.input) == 2, "the takeover committed")
        before = restores(successor)
    finally:
        paused.signal(signal.SIGCONT)
    wait_for(
        lambda: restores(paused) >= 2 and restores(successor) > before,
        "the resumed worker back in the group, the partitions shared again",
        workers=[paused, successor],
    )
    assert "lost: their uncommitted work is dropped" in paused.log.read_text(), paused.tail()
    # Its batches are long: stopped, it commits what it did since, and the successor restores
    # every partition from the changelog as the two left it.
    before = restores(successor)
    assert paused.stop() == 0, paused.tail()
    wait_for(
        lambda: restores(successor) > before,
        "the successor to restore every partition",
        workers=[successor],
    )
    deployment.publish([(key.encode(), stale)], partition=0)
    expected = audited([first, takeover, stale])
    assert len(expected) == 1
    with deployment.reader(t.findings) as findings:
        wait_for_audit(findings, expected, [successor])
    assert successor.stop() == 0, successor.tail()


def test_a_bridge_that_lost_its_partitions_announces_nothing_again(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    """The paused bridge had triggered the findings; its successor restores that, resolves
    them, and saves it. The resumed bridge gets partitions back with the successor's state:
    nothing is triggered or resolved twice."""
    config = kafka_broker.client_config()
    topic = findings_topic(config, partitions=2)
    opened, resolved = critical_findings(4, "lost")
    with PagerDutyReceiver(KEY) as pd:
        paused, successor = one_group(config, topic, tmp_path, pd)
        try:
            paused.start()
            until(
                lambda: len(paused.samples("splitbrain_page_consumer_lag_records")) == 2,
                "both partitions assigned",
                paused,
            )
            publish(config, topic, *opened, spread=2)
            until(lambda: len(pd.incidents) == 4 and settled(paused), "four incidents", paused)
            signal_bridge(paused, signal.SIGSTOP)
            successor.start()  # it owns both once the paused bridge's session expired
            takes_over_and_resolves(successor, topic, 2, resolved, pd)
            until(lambda: settled(successor), "the resolutions saved and committed", successor)
            signal_bridge(paused, signal.SIGCONT)
            until(
                lambda: (
                    len(paused.samples("splitbrain_page_consumer_lag_records")) == 1
                    and len(successor.samples("splitbrain_page_consumer_lag_records")) == 1
                    and settled(paused)
                    and settled(successor)
                ),
                "the resumed bridge back in the group, one partition each",
                paused,
            )
            assert "lost: their unsaved state is dropped" in paused.text(), paused.text()
            assert paused.sample("splitbrain_page_findings_open") == 0
            actions = [(r.event or {}).get("event_action") for r in pd.requests]
            assert Counter(actions) == {"trigger": 4, "resolve": 4}, actions
            assert paused.stop() == 0
            assert successor.stop() == 0
        finally:
            paused.kill()
            successor.kill()
