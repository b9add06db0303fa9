"""A job class's lease policy (issues 10 and 23; DESIGN §4, lease health):
L > H + R x max(H, T) + J, checked when the class is defined, and no way for a caller to choose
its own lease."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from detector.leases import JobClass, Labels, LeaseInputError, db
from detector.leases.policy import EXTEND_TIMEOUT_S, MAX_LABEL_SETS, LabelValues

POLICY: dict[str, Any] = {
    "name": "web_search",
    "lease_s": 40,
    "heartbeat_s": 5,
    "missed_heartbeats": 3,
    "reserve_s": 10,
    "extend_timeout_s": 2,  # a failed extension fails fast: the rule is L > (R+1) x H + J
    "max_attempts": 3,
    "tool_timeout_s": 20,
    "stage_time_limit_s": 600,
}


def test_a_lease_that_outlasts_its_missed_heartbeats_is_accepted() -> None:
    web = JobClass(**POLICY)
    assert web.lease.total_seconds() == 40


@pytest.mark.parametrize("lease_s", [30, 29.5, 25, 1])
def test_a_lease_no_longer_than_its_missed_heartbeats_is_refused_with_the_numbers(
    lease_s: float,
) -> None:
    with pytest.raises(ValidationError) as refused:
        JobClass(**{**POLICY, "lease_s": lease_s})
    assert (
        f"job class 'web_search': lease_s={lease_s:g} must be more than heartbeat_s + "
        "missed_heartbeats x max(heartbeat_s, extend_timeout_s) + reserve_s = "
        "5 + 3 x max(5, 2) + 10 = 30 (L > H + R x max(H, T) + J): after the last heartbeat that"
        " succeeded, 3 failed ones take a period each, or up to 2s if an extension hangs"
    ) in str(refused.value)


def test_a_failed_extension_longer_than_a_period_is_counted() -> None:
    """Issue 23: the heartbeat sends the next extension when a slow one returns, so each of the
    R failed extensions can hold the next back by T, the extension timeout, instead of H."""
    assert JobClass(**POLICY).lease_s == 40  # T = 2 <= H: 5 + 3 x 5 + 10 = 30 < 40
    with pytest.raises(ValidationError, match=r"5 \+ 3 x max\(5, 10\) \+ 10 = 45 "):
        JobClass(**{**POLICY, "extend_timeout_s": 10})
    assert JobClass(**{**POLICY, "extend_timeout_s": 10, "lease_s": 46}).lease_s == 46


def test_by_default_a_failed_extension_takes_the_store_connection_s_bounds() -> None:
    """Unless the class says less, T is what the store's connection allows one call: a reconnect
    and a statement given up on (detector.leases.db), 20 s."""
    defaults = {k: v for k, v in POLICY.items() if k != "extend_timeout_s"}
    seconds = float(db._DEFAULTS["connect_timeout"])
    seconds += int(db.SERVER_SETTINGS["statement_timeout"]) / 1000
    assert EXTEND_TIMEOUT_S == seconds == 20
    with pytest.raises(ValidationError, match=r"5 \+ 3 x max\(5, 20\) \+ 10 = 75 "):
        JobClass(**defaults)
    assert JobClass(**{**defaults, "lease_s": 76}).extend_timeout_s == 20


def test_the_issue_s_example_that_one_miss_loses_is_refused() -> None:
    """L=36, H=30, R=1, J=5: the heartbeat after one miss is sent 60 s after the last success,
    when a 36 s lease is long gone."""
    with pytest.raises(ValidationError, match=r"30 \+ 1 x max\(30, 2\) \+ 5 = 65"):
        JobClass(
            **{**POLICY, "lease_s": 36, "heartbeat_s": 30, "missed_heartbeats": 1, "reserve_s": 5}
        )


@pytest.mark.parametrize(
    ("lease_s", "heartbeat_s", "missed", "reserve_s"),
    [(40, 5, 3, 10), (2.6, 0.5, 2, 1), (66, 30, 1, 5), (1, 0.2, 2, 0.3), (12, 2, 3, 2)],
)
def test_every_accepted_class_extends_early(
    lease_s: float, heartbeat_s: float, missed: int, reserve_s: float
) -> None:
    """The practice's "extend early": the first heartbeat after a success is sent with at least
    one full period and the reserve left; and the (R+1)-th with the reserve left."""
    c = JobClass(
        **{
            **POLICY,
            "lease_s": lease_s,
            "heartbeat_s": heartbeat_s,
            "missed_heartbeats": missed,
            "reserve_s": reserve_s,
            "extend_timeout_s": heartbeat_s,
        }
    )
    assert c.lease_s - c.heartbeat_s > c.heartbeat_s + c.reserve_s
    assert c.lease_s - (c.missed_heartbeats + 1) * c.heartbeat_s > c.reserve_s


def test_the_rule_is_strict_where_floating_point_rounds() -> None:
    """0.1 + 2 x 0.1 + 0.2 is 0.5000000000000001 in floating point: a lease of 0.5 is refused (it is
    not more than the floor), and the message shows the floor as written."""
    tight = {**POLICY, "heartbeat_s": 0.1, "missed_heartbeats": 2, "reserve_s": 0.2}
    tight["extend_timeout_s"] = 0.1
    with pytest.raises(ValidationError, match=r"0.1 \+ 2 x max\(0.1, 0.1\) \+ 0.2 = 0.5 "):
        JobClass(**{**tight, "lease_s": 0.5})
    assert JobClass(**{**tight, "lease_s": 0.51}).lease_s == 0.51


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("heartbeat_s", 0),
        ("lease_s", -1),
        ("missed_heartbeats", 0),
        ("reserve_s", -0.1),
        ("extend_timeout_s", 0),
        ("max_attempts", 0),
        ("tool_timeout_s", 0),
        ("stage_time_limit_s", float("inf")),
        ("name", ""),
    ],
)
def test_a_value_out_of_range_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        JobClass(**{**POLICY, field: value})


def test_a_caller_cannot_choose_its_own_lease() -> None:
    with pytest.raises(ValidationError, match="ttl_s"):
        JobClass.model_validate({**POLICY, "ttl_s": 3600})
    web = JobClass(**POLICY)
    with pytest.raises(ValidationError, match="frozen"):
        web.lease_s = 3600  # type: ignore[misc]


def test_labels_are_bounded_and_only_the_given_ones_are_attrs() -> None:
    assert Labels(tool_class="ocr", provider="local").attrs() == {
        "tool_class": "ocr",
        "provider": "local",
    }
    with pytest.raises(ValidationError, match="model"):
        Labels(model="m" * 129)
    with pytest.raises(ValidationError, match="tool_class"):
        Labels(tool_class="")


def test_retries_wait_half_fixed_half_drawn_doubling_to_the_maximum() -> None:
    slow = JobClass(**POLICY, retry_backoff_s=60, retry_backoff_max_s=100)
    assert [slow.retry_delay_s(a, 0.0) for a in (1, 2, 3)] == [30, 50, 50]
    assert [slow.retry_delay_s(a, 1.0) for a in (1, 2, 3)] == [60, 100, 100]


def test_a_class_counts_its_jobs_under_the_labels_it_declares_and_refuses_others() -> None:
    """Issue 38: the live gauges split a class by tool, model and provider only where the class
    says its jobs differ, and only into the values it declares."""
    llm = JobClass(
        **POLICY, labels=LabelValues(model={"model-a", "model-b"}, provider={"acme-llm"})
    )
    job = Labels(tool_class="web_search", model="model-b", provider="acme-llm")
    assert llm.gauge_labels(job) == {"model": "model-b", "provider": "acme-llm"}
    assert JobClass(**POLICY).gauge_labels(job) == {}
    with pytest.raises(LeaseInputError, match=r"model: job class 'web_search' declares model-a, "):
        llm.gauge_labels(Labels(model="model-c", provider="acme-llm"))
    with pytest.raises(LeaseInputError, match=r"provider: .* got None"):
        llm.gauge_labels(Labels(model="model-b"))


def test_a_class_s_label_combinations_are_bounded() -> None:
    values = frozenset(f"v{n}" for n in range(8))
    assert len(LabelValues(model=values, provider=values).declared()) == 2  # 64 combinations
    with pytest.raises(ValidationError, match=f"128 label combinations; .* {MAX_LABEL_SETS}"):
        LabelValues(tool_class=frozenset({"a", "b"}), model=values, provider=values)
    with pytest.raises(ValidationError, match="model"):
        LabelValues(model=frozenset({""}))
