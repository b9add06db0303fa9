"""The property campaign (issue 33): find the next crash before a user does.

Histories are the shapes users send (`gen.user_history`): many effect keys per condition, sorted
every way; mixed seq and no seq; ties; late acquisitions; chains of takeovers; retries; every
event kind from every source; names as long as the contract allows. Over them:

1. no exception, in the worker's step (`observe`, `advance`), in `audit` (`finish`) and in
   rendering (the findings, their JSON, the text report);
2. each finding's revisions are 1, 2, 3 … (so no (finding_id, revision) pair twice);
3. every revision encodes under 64 KiB;
4. the worker's step and `audit` agree on the final findings of the same history;
5. with seq on every event, the final findings do not depend on the arrival order;
6. the engine's findings are the last revisions it published.

(2, 3 and 6 are `runners.Published`.) The budget is the hypothesis profile's (tests/conftest.py);
every history a campaign falsifies is kept in tests/unit/regressions.py and replayed below.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Container
from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detector.cli.audit import render_text
from detector.core import Config
from detector.histories.audit import audit_lines

from .gen import Row, build, lengthened, objs, user_history
from .regressions import (
    ACQUISITION_AFTER_A_DUPLICATE,
    ACQUISITION_BEFORE_A_WITNESS_BY_SEQ_ONLY,
    ACQUISITION_CUT,
    COMMITTERS_OF_ONE_EPOCH_IN_ANY_ORDER,
    DISPLACED_WORKERS_OF_ONE_EPOCH_IN_ANY_ORDER,
    EARLIER_ACQUISITION_OF_THE_SAME_EPOCH,
    EARLIER_ACQUISITION_UNDER_A_RETRY,
    KEYS_SORTING_BEFORE_THE_COMMIT,
    REACQUIRED_WITH_EVIDENCE_CUT,
    RETRIES_WITH_EFFECT_KEYS_EVICTED,
    RETRY_THEN_KEYS_CUT,
    authoritative,
)
from .runners import Published, audit, changed_fields, final, records, worker

# The worker's caps, audit's, and caps so small that every history is cut somewhere (each cut
# must say so, never crash or change a finding silently).
CONFIGS = st.sampled_from(
    [
        Config(),
        Config(quiet_period_s=60.0),
        Config.for_audit(),
        Config(max_evidence=3, max_acquisitions=2, max_effect_keys=5, max_event_ids=8),
    ]
)


# Names as users write them, or as long as the contract allows (see `gen.lengthened`).
NAMES = st.sampled_from(("short", "short", "end", "middle"))


def named(rows: list[Row], names: str) -> list[Row]:
    return rows if names == "short" else lengthened(rows, names)


def lines(rows: list[Row]) -> list[bytes]:
    return [value for _, value in records(objs(rows))]


# ---- the invariants, each over one history ---------------------------------------------------


def survives_in_a_worker(arrived: list[Row], config: Config, ticks: Container[int] = ()) -> None:
    """Invariants 1, 2, 3, 6 in a worker: record i at 25 s on its clock, time passing after the
    records numbered in `ticks` (so findings resolve by silence and reopen)."""
    worker(records(objs(arrived)), config, spacing=25.0, ticks=ticks)


def audit_agrees_with_the_worker(arrived: list[Row], config: Config) -> None:
    """Invariants 1 and 4: the same bytes through `audit` and through a worker's step, under the
    same caps. Neither measures silence (no `observed_at`, the worker's clock stands still), so
    the two must end with the very same revisions."""
    untimed = [r._replace(t=None) for r in arrived]
    result = audit_lines(lines(untimed), config=config)
    assert result.bad_count == 0, result.bad_lines
    render_text(result, io.StringIO())
    _, published = worker(records(objs(untimed)), config)
    assert sorted(result.findings) == sorted(published.latest)
    for fid, f in result.findings.items():
        assert f == published.latest[fid], (fid, changed_fields(f, published.latest[fid]))


def audited(rows: list[Row]) -> list[dict[str, Any]]:
    """Final documents of `audit`'s engine over `rows`, its revision stream checked."""
    d, updates = audit(build(rows))
    published = Published()
    published.take(updates)
    published.agree(d)
    return final(d.findings())


def arrival_changes_nothing(in_order: list[Row], arrived: list[Row]) -> None:
    """Invariant 5 (DESIGN §4), seq on every event: statuses included; `audit`'s own times
    measure silence."""
    assert audited(arrived) == audited(in_order)


# ---- the campaign ----------------------------------------------------------------------------


@given(user_history(), NAMES, CONFIGS, st.lists(st.booleans(), max_size=200))
def test_the_worker_step_survives_and_publishes_each_change_once_and_small(
    case: tuple[list[Row], list[Row]], names: str, config: Config, ticks: list[bool]
) -> None:
    survives_in_a_worker(named(case[1], names), config, {i for i, t in enumerate(ticks) if t})


@given(user_history(), NAMES, CONFIGS)
def test_audit_survives_and_agrees_with_the_worker_step(
    case: tuple[list[Row], list[Row]], names: str, config: Config
) -> None:
    audit_agrees_with_the_worker(named(case[1], names), config)


@given(user_history(seq=("all", "tied")), NAMES)
def test_with_seq_on_every_event_arrival_changes_no_final_finding(
    case: tuple[list[Row], list[Row]], names: str
) -> None:
    in_order, arrived = case
    arrival_changes_nothing(named(in_order, names), named(arrived, names))


# ---- what the campaign found (tests/unit/regressions.py) ---------------------------------------


def in_any_order(rows: list[Row]) -> None:
    """`arrival_changes_nothing` for `rows` (seq on every event) against their seq order."""
    arrival_changes_nothing(authoritative(rows), rows)


@pytest.mark.parametrize(
    ("check", "rows"),
    [
        pytest.param(
            partial(survives_in_a_worker, config=Config()),
            KEYS_SORTING_BEFORE_THE_COMMIT,
            id="worker: a commit sorting after 20 attempted keys",
        ),
        pytest.param(
            partial(audit_agrees_with_the_worker, config=Config.for_audit()),
            KEYS_SORTING_BEFORE_THE_COMMIT,
            id="audit: a commit sorting after 20 attempted keys",
        ),
        pytest.param(
            in_any_order,
            KEYS_SORTING_BEFORE_THE_COMMIT[::-1],
            id="arrival: a commit sorting after 20 attempted keys, newest first",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config(max_acquisitions=2)),
            ACQUISITION_CUT,
            id="worker: an acquisition cut, max_acquisitions=2",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config(max_acquisitions=1)),
            ACQUISITION_CUT,
            id="worker: an acquisition cut, max_acquisitions=1",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config(max_effect_keys=2)),
            RETRY_THEN_KEYS_CUT,
            id="worker: a retry, then an effect-key cut, max_effect_keys=2",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config.for_audit()),
            EARLIER_ACQUISITION_OF_THE_SAME_EPOCH,
            id="worker: an earlier acquisition of the same epoch arrives last",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config.for_audit()),
            EARLIER_ACQUISITION_UNDER_A_RETRY,
            id="worker: an earlier acquisition of the current epoch under a retry",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config.for_audit()),
            ACQUISITION_AFTER_A_DUPLICATE,
            id="worker: an acquisition after a duplicate, no seq",
        ),
        pytest.param(
            in_any_order,
            DISPLACED_WORKERS_OF_ONE_EPOCH_IN_ANY_ORDER,
            id="arrival: two workers of the displaced epoch",
        ),
        pytest.param(
            in_any_order,
            COMMITTERS_OF_ONE_EPOCH_IN_ANY_ORDER,
            id="arrival: two committers of one epoch and a lower epoch's commit",
        ),
        pytest.param(
            partial(audit_agrees_with_the_worker, config=Config(max_evidence=3)),
            REACQUIRED_WITH_EVIDENCE_CUT,
            id="audit against the worker: an epoch acquired again, max_evidence=3",
        ),
        pytest.param(
            partial(
                audit_agrees_with_the_worker,
                config=Config(
                    max_evidence=3, max_acquisitions=2, max_effect_keys=5, max_event_ids=8
                ),
            ),
            RETRIES_WITH_EFFECT_KEYS_EVICTED,
            id="audit against the worker: retries, effect keys evicted twice, max_effect_keys=5",
        ),
        pytest.param(
            partial(survives_in_a_worker, config=Config()),
            ACQUISITION_BEFORE_A_WITNESS_BY_SEQ_ONLY,
            id="worker: an acquisition after the latest commit by arrival, before one by seq",
        ),
    ],
)
def test_what_the_campaign_found(check: Callable[[list[Row]], None], rows: list[Row]) -> None:
    check(rows)
