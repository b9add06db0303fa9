"""Histories the property campaigns once falsified, kept as explicit regression examples.

Each is written as hypothesis printed it (or as `gen.minimize` cut it down), in arrival order;
the tests that replay them say what went wrong and whether the engine still gets it wrong.
"""

from __future__ import annotations

from .gen import Row


def authoritative(arrived: list[Row]) -> list[Row]:
    """The authoritative order of a history with seq on every event (distinct per workflow)."""
    return sorted(arrived, key=lambda r: (r.wf, r.seq or 0))


# tests/unit/test_properties.py, test_revision_stream_is_gapless_unique_and_severity_never_drops
# (issue 33's falsifying example, as hypothesis printed it): two workflows whose epoch-0 zombie
# keeps sending heartbeats with an effect key; one `advance` after the 31st record (at 25 s per
# record, quiet period 60 s). A resolved finding of wf1 then renders with confidence medium and
# evidence_truncated true, where its last revision said high and false, and no revision is
# published.
FINDING_WITHOUT_REVISION = [
    Row("wf1", "wf1-0", "lease_acquired", 0, "w0", "coordinator", 1, None, 0.0),
    Row("wf0", "wf0-0", "lease_acquired", 0, "w0", "coordinator", 1, None, 0.0),
    Row("wf0", "wf0-1", "lease_acquired", 1, "w1", "coordinator", 2, None, 0.0),
    Row("wf1", "wf1-1", "lease_acquired", 1, "w1", "coordinator", 2, None, 0.0),
    Row("wf0", "wf0-2", "heartbeat", 0, "w0", "worker", 3, "k0", 1.0),
    Row("wf0", "wf0-3", "heartbeat", 0, "w0", "worker", 4, "k0", 2.0),
    Row("wf0", "wf0-4", "heartbeat", 0, "w0", "worker", 5, "k0", 3.0),
    Row("wf0", "wf0-5", "heartbeat", 0, "w0", "worker", 6, "k0", 4.0),
    Row("wf0", "wf0-6", "lease_acquired", 2, "w2", "coordinator", 7, None, 4.0),
    Row("wf0", "wf0-7", "heartbeat", 0, "w0", "worker", 8, "k0", 5.0),
    Row("wf0", "wf0-8", "heartbeat", 0, "w0", "worker", 9, "k0", 6.0),
    Row("wf0", "wf0-9", "heartbeat", 0, "w0", "worker", 10, "k0", 7.0),
    Row("wf0", "wf0-10", "heartbeat", 0, "w0", "worker", 11, "k0", 8.0),
    Row("wf1", "wf1-2", "heartbeat", 0, "w0", "worker", 3, "k0", 1.0),
    Row("wf1", "wf1-3", "heartbeat", 0, "w0", "worker", 4, "k0", 2.0),
    Row("wf1", "wf1-4", "heartbeat", 0, "w0", "worker", 5, "k0", 3.0),
    Row("wf1", "wf1-5", "heartbeat", 0, "w0", "worker", 6, "k0", 4.0),
    Row("wf1", "wf1-6", "heartbeat", 0, "w0", "worker", 7, "k0", 5.0),
    Row("wf1", "wf1-7", "heartbeat", 0, "w0", "worker", 8, "k0", 6.0),
    Row("wf1", "wf1-8", "lease_acquired", 2, "w2", "coordinator", 9, None, 6.0),
    Row("wf1", "wf1-9", "heartbeat", 0, "w0", "worker", 10, "k0", 7.0),
    Row("wf1", "wf1-10", "heartbeat", 0, "w0", "worker", 11, "k0", 8.0),
    Row("wf1", "wf1-11", "heartbeat", 0, "w0", "worker", 12, "k0", 9.0),
    Row("wf1", "wf1-12", "heartbeat", 0, "w0", "worker", 13, "k0", 10.0),
    Row("wf1", "wf1-13", "heartbeat", 0, "w0", "worker", 14, "k0", 11.0),
    Row("wf1", "wf1-20", "lease_released", 2, "w2", "worker", 21, None, 17.0),
    Row("wf1", "wf1-16", "heartbeat", 0, "w0", "worker", 17, "k0", 13.0),
    Row("wf1", "wf1-17", "heartbeat", 0, "w0", "worker", 18, "k0", 14.0),
    Row("wf1", "wf1-14", "heartbeat", 1, "w1", "worker", 15, "k0", 12.0),
    Row("wf0", "wf0-11", "heartbeat", 0, "w0", "worker", 12, "k0", 9.0),
    Row("wf0", "wf0-12", "heartbeat", 0, "w0", "worker", 13, "k0", 10.0),
    Row("wf1", "wf1-18", "heartbeat", 0, "w0", "worker", 19, "k0", 15.0),
    Row("wf1", "wf1-19", "heartbeat", 0, "w0", "worker", 20, "k0", 16.0),
    Row("wf1", "wf1-15", "lease_acquired", 3, "w3", "coordinator", 16, None, 12.0),
    Row("wf1", "wf1-21", "heartbeat", 0, "w0", "worker", 22, "k0", 18.0),
]
FINDING_WITHOUT_REVISION_TICKS = [False] * 30 + [True]


def _row(i: int, kind: str, epoch: int, seq: int | None, key: str | None = None) -> Row:
    """An event of workflow wf0 as the campaign writes it (`gen.user_workflow`), untimed."""
    source = "coordinator" if kind == "lease_acquired" else "worker"
    return Row("wf0", f"wf0-{i}", kind, epoch, f"w{epoch}", source, seq, key, None)


# tests/unit/test_campaign.py (every test): the displaced owner attempts 20 keys, then commits
# one that sorts after all of them. The response lists the committed keys among the 20 listed,
# finds none, and `_listing([])` raises IndexError (issue 33's poison pill, shrunk).
KEYS_SORTING_BEFORE_THE_COMMIT = [
    _row(0, "lease_acquired", 0, 1),
    _row(1, "lease_acquired", 1, 2),
    *(_row(2 + j, "effect_attempted", 0, 3 + j, f"a{j:02d}") for j in range(20)),
    _row(22, "effect_committed", 0, 23, "a99"),
]

# tests/unit/test_campaign.py, the worker's step with max_acquisitions=2: the third acquisition
# (epoch 2, after the stale heartbeat) pushes out a retained acquisition. The open finding now
# renders evidence_truncated true and confidence medium, but no revision says so (its readers
# keep revision 1: high, not truncated). With max_acquisitions=1 the same cut also moves the
# finding's transition to the epoch-2 acquisition, which is *after* the stale heartbeat, drops
# `current`, and turns the ordering to arrival, still with no revision and without
# evidence_truncated.
ACQUISITION_CUT = [
    _row(0, "lease_acquired", 0, 1),
    _row(2, "lease_acquired", 1, 3),
    _row(3, "heartbeat", 0, 4),
    _row(4, "lease_acquired", 2, 5),
]

# tests/unit/test_campaign.py, the worker's step against `audit`, max_evidence=3: epoch 1 is
# acquired again after the stale heartbeat. The worker's finding stays at revision 1 (high, not
# truncated); `audit` publishes a revision 2 at `finish()` (medium, evidence_truncated) for the
# same bytes and caps. They disagree on whether the verdict was cut.
REACQUIRED_WITH_EVIDENCE_CUT = [
    _row(0, "lease_acquired", 0, 1),
    _row(2, "lease_acquired", 1, 3),
    _row(3, "heartbeat", 0, 4),
    _row(4, "lease_acquired", 1, 5),
]

# tests/unit/test_campaign.py, the worker's step with max_effect_keys=2: one owner, no takeover;
# key a00 committed twice under epoch 0 (a retry finding, revision 1), then two more keys
# committed. The third key cuts the workflow's effect keys: the retry finding now renders
# evidence_truncated true, and no revision says so.
RETRY_THEN_KEYS_CUT = [
    _row(0, "lease_acquired", 0, 1),
    _row(1, "effect_committed", 0, 2, "a00"),
    _row(2, "effect_committed", 0, 3, "a00"),
    _row(3, "effect_committed", 0, 4, "a01"),
    _row(4, "effect_committed", 0, 5, "a02"),
]

# tests/unit/test_campaign.py, the worker's step with audit's caps (nothing is cut): epoch 10
# acquired at seq 70; epoch 6 attempts a11 without seq (after the takeover by arrival: a
# stale_effect_attempt finding, transition wf1-69); then epoch 10's earlier acquisition (seq 66)
# arrives. The held finding now names wf1-65 as its transition, has no `current` and its
# response says "the current owner" instead of w10 (epoch 10), and no revision is published.
EARLIER_ACQUISITION_OF_THE_SAME_EPOCH = [
    Row("wf1", "wf1-69", "lease_acquired", 10, "w10", "coordinator", 70, None, 1656.0),
    Row("wf1", "wf1-51", "effect_attempted", 6, "w6", "worker", None, "a11", 902.0),
    Row("wf1", "wf1-65", "lease_acquired", 10, "w10", "coordinator", 66, None, 959.0),
]

# tests/unit/test_campaign.py, arrival with seq on every event: key z00 committed under epoch 15
# by w15 (destination, seq 13) and w15b (a worker's claim, seq 14), and under epoch 5 (seq 20).
# The failover duplicate's response names the epoch-15 committer that arrived first: w15b in
# this arrival, w15 in seq order. Its final document depends on arrival (DESIGN §4).
COMMITTERS_OF_ONE_EPOCH_IN_ANY_ORDER = [
    Row("wf1", "wf1-25", "effect_committed", 15, "w15b", "worker", 14, "z00", 2200.0),
    Row("wf1", "wf1-37", "effect_committed", 5, "w5", "destination", 20, "z00", 2902.0),
    Row("wf1", "wf1-24", "effect_committed", 15, "w15", "destination", 13, "z00", 2199.0),
]

# tests/unit/test_campaign.py, the worker's step with audit's caps: a retry finding of epoch 6
# (z00 committed twice without seq, current w9 by the acquisition at seq 29 between them); then
# epoch 9's earlier acquisition (seq 25) arrives and epoch 6 commits m01. The held retry finding
# has lost its `current` (w9, epoch 9), and no revision is published.
EARLIER_ACQUISITION_UNDER_A_RETRY = [
    Row("wf0", "wf0-22", "effect_committed", 6, "w6", "destination", None, "z00", None),
    Row("wf0", "wf0-28", "lease_acquired", 9, "w9", "coordinator", 29, None, None),
    Row("wf0", "wf0-23", "effect_committed", 6, "w6", "destination", None, "z00", None),
    Row("wf0", "wf0-24", "lease_acquired", 9, "w9", "coordinator", 25, None, None),
    Row("wf0", "wf0-26", "effect_committed", 6, "w6", "destination", None, "m01", None),
]

# tests/unit/test_campaign.py, the worker's step with audit's caps, no seq anywhere: z00 claimed
# committed under epochs 5 and 8 (a failover duplicate with no transition), then epoch 9 is
# acquired. The held finding names that acquisition, which came after both commits, as its
# transition, and no revision is published.
ACQUISITION_AFTER_A_DUPLICATE = [
    Row("wf0", "wf0-61", "effect_committed", 5, "w5b", "worker", None, "z00", 996.0),
    Row("wf0", "wf0-80", "effect_committed", 8, "w8", "worker", None, "z00", 2354.0),
    Row("wf0", "wf0-78", "lease_acquired", 9, "w9", "coordinator", None, None, 2312.0),
]

# tests/unit/test_campaign.py, arrival with seq on every event: epoch 3 acquired at seq 11, then
# m03 committed under epoch 1 by w1 (seq 13) and by w1b (seq 14). The finding's `displaced`
# worker (and its response) is the epoch-1 worker whose commit arrived first: w1b in this
# arrival, w1 in seq order.
DISPLACED_WORKERS_OF_ONE_EPOCH_IN_ANY_ORDER = [
    Row("wf0", "wf0-13", "effect_committed", 1, "w1b", "coordinator", 14, "m03", 4681.0),
    Row("wf0", "wf0-10", "lease_acquired", 3, "w3", "worker", 11, None, 3989.0),
    Row("wf0", "wf0-12", "effect_committed", 1, "w1", "worker", 13, "m03", 4680.0),
]

# tests/unit/test_campaign.py, audit against the worker with tiny caps (max_effect_keys=5): one
# retry finding of epoch 0 holds five keys committed twice; m01's second commit alone carries a
# seq. Evicting effect keys at the cap a second time forgot m01's pair, so the held finding's
# ordering read authoritative_seq from its witness alone, with no revision published.
RETRIES_WITH_EFFECT_KEYS_EVICTED = [
    Row("wf0", "wf0-0", "lease_acquired", 0, "w0", "coordinator", None, None, None),
    Row("wf0", "wf0-1", "effect_committed", 0, "w0", "coordinator", None, "a00", None),
    Row("wf0", "wf0-3", "lease_acquired", 0, "w0", "coordinator", None, None, None),
    Row("wf0", "wf0-11", "lease_acquired", 0, "w0", "coordinator", None, None, None),
    Row("wf0", "wf0-8", "effect_attempted", 0, "w0", "worker", None, "a03", None),
    Row("wf0", "wf0-9", "effect_committed", 0, "w0", "coordinator", None, "m01", None),
    Row("wf0", "wf0-6", "effect_committed", 0, "w0", "coordinator", None, "a01", None),
    Row("wf0", "wf0-7", "effect_committed", 0, "w0", "coordinator", None, "a01", None),
    Row("wf0", "wf0-4", "effect_committed", 0, "w0", "coordinator", None, "m00", None),
    Row("wf0", "wf0-5", "effect_committed", 0, "w0", "coordinator", None, "m00", None),
    Row("wf0", "wf0-10", "effect_committed", 0, "w0", "coordinator", 11, "m01", None),
    Row("wf0", "wf0-2", "effect_committed", 0, "w0", "coordinator", None, "a00", None),
    Row("wf0", "wf0-12", "effect_committed", 0, "w0", "coordinator", None, "a02", None),
    Row("wf0", "wf0-13", "effect_committed", 0, "w0", "coordinator", None, "a02", None),
    Row("wf0", "wf0-14", "lease_acquired", 0, "w0", "coordinator", None, None, None),
    Row("wf0", "wf0-15", "lease_acquired", 0, "w0", "coordinator", None, None, None),
    Row("wf0", "wf0-16", "effect_attempted", 0, "w0", "coordinator", None, "a00", None),
    Row("wf1", "wf1-0", "lease_acquired", 0, "w0", "coordinator", 1, None, None),
]

# tests/unit/test_campaign.py, the worker's step (slow profile): epoch 0 commits a00 and a01
# without seq; epoch 1 commits a00 at seq 16 and a01 without seq, and its acquisition (seq 15)
# arrives last. It comes after the duplicates' latest commit by arrival but before a00's at seq
# 16 by seq: it is that duplicate's transition, and it was not looked at, so the held finding
# named it (authoritative_seq) with no revision published.
ACQUISITION_BEFORE_A_WITNESS_BY_SEQ_ONLY = [
    Row("wf0", "wf0-0", "lease_acquired", 0, "w0", "coordinator", None, None, None),
    Row("wf0", "wf0-11", "effect_committed", 0, "w0", "coordinator", None, "a00", None),
    Row("wf0", "wf0-12", "effect_committed", 0, "w0", "coordinator", None, "a01", None),
    Row("wf0", "wf0-15", "effect_committed", 1, "w1", "coordinator", 16, "a00", None),
    Row("wf0", "wf0-16", "effect_committed", 1, "w1", "coordinator", None, "a01", None),
    Row("wf0", "wf0-14", "lease_acquired", 1, "w1", "coordinator", 15, None, None),
]
