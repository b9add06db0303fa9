"""The rules the settings of every command rest on: the engine's bounds, and how a value's source
is named."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Annotated

import pytest
from pydantic import Field, create_model
from pydantic_settings import SettingsConfigDict

from detector.core import Config
from detector.settings import (
    CommandSettings,
    PortOrOff,
    PositiveInt,
    SecondsOrOff,
    Secret,
    SettingsError,
    declared_fields,
)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Declared:
    """What a command's code reads, declaring its settings: `built` is made from them."""

    port: Annotated[PortOrOff, Field(description="serve here (0: off)")] = 0
    give_up_s: Annotated[SecondsOrOff, Field(description="give up after (0: never)")] = 300.0
    built: dict[str, str]


_FromDeclared = create_model(
    "_FromDeclared", __base__=CommandSettings, **declared_fields(_Declared)
)


def test_a_declared_field_with_a_default_is_a_setting_and_0_turns_it_off() -> None:
    assert set(_FromDeclared.model_fields) == {"port", "give_up_s"}
    off = _FromDeclared.from_args(argparse.Namespace(give_up_s="0"))
    assert off.model_dump() == {"port": None, "give_up_s": None}  # the default 0 is off too
    on = _FromDeclared.from_args(argparse.Namespace(port="9"))
    assert on.model_dump() == {"port": 9, "give_up_s": 300.0}
    with pytest.raises(SettingsError, match="--port='-1': expected a port number from 0 to 65535"):
        _FromDeclared.from_args(argparse.Namespace(port="-1"))


class _Prefixed(CommandSettings):
    model_config = SettingsConfigDict(env_prefix="SPLITBRAIN_SAMPLE_")

    token: Secret = Field(None, description="the sample's token")


def test_a_prefix_of_its_own_names_the_variables_in_help_errors_and_refusals(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="sample")
    _Prefixed.add_flags(parser)
    assert "or set env SPLITBRAIN_SAMPLE_TOKEN" in " ".join(parser.format_help().split())
    with pytest.raises(SystemExit):
        parser.parse_args(["--token", "x"])
    assert "set SPLITBRAIN_SAMPLE_TOKEN or pass --token-file PATH" in capsys.readouterr().err
    monkeypatch.setenv("SPLITBRAIN_SAMPLE_TOKEN", "")
    with pytest.raises(SettingsError, match=r"^SPLITBRAIN_SAMPLE_TOKEN: expected a non-empty"):
        _Prefixed.from_env()
