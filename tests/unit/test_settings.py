"""The rules the settings of every command rest on: the engine's bounds, and how a value's source
is named."""

from __future__ import annotations

import argparse

import pytest
from pydantic import Field

from detector.core import Config
from detector.settings import CommandSettings, PositiveInt, SettingsError

CAPS = ("max_evidence", "max_acquisitions", "max_effect_keys", "max_event_ids", "missed_heartbeats")
PERIODS = ("quiet_period_s", "clock_skew_s", "idle_ttl_s")


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize(
    ("name", "rule"), [(cap, "at least 1") for cap in CAPS] + [(p, "more than 0") for p in PERIODS]
)
def test_config_refuses_caps_below_1_and_periods_of_0_or_less(
    name: str, rule: str, value: int
) -> None:
    with pytest.raises(ValueError, match=f"{name} must be {rule}"):
        Config(**{name: value})


class _Sample(CommandSettings):
    sample_count: PositiveInt = Field(3, description="how many")


def test_a_variable_is_matched_regardless_of_case_and_named_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("splitbrain_sample_count", "4")
    assert _Sample.from_args(argparse.Namespace()).sample_count == 4
    monkeypatch.setenv("splitbrain_sample_count", "many")
    with pytest.raises(SettingsError) as refused:
        _Sample.from_args(argparse.Namespace())
    assert str(refused.value) == (
        "splitbrain_sample_count='many': expected a whole number from 1 to 2147483647"
    )
