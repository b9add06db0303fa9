"""Job classes and their lease policy, and the bounded labels a job carries.

A job's lease and retries come from its class, never from the caller: a worker, or a model
choosing a tool, cannot ask for a longer lease or more attempts than the class allows. A class
whose numbers would let a live worker lose its lease to a few late heartbeats is refused when it
is defined: L > (R+1) x H + J. After the last extension that succeeded, R attempts may fail, and
the one after them is sent (R+1) x H later: it must reach the database before the lease runs out,
with the reserve J for jitter, pauses and the database (DESIGN §4's lease health, counted to the
attempt that must succeed). With R >= 1 the rule also makes every heartbeat "extend early": the
first attempt after a success is sent with L - H > H + J left, a full period and the reserve.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from detector.contracts.events import ShortLabel
from detector.settings import PositiveInt, PositiveSeconds, Seconds

MAX_NAME_CHARS: Final = 128

Label = Annotated[ShortLabel, Field(min_length=1)]


class JobClass(BaseModel):
    """The policy of one class of jobs (a tool such as `web_search` or `ocr`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    lease_s: PositiveSeconds = Field(description="L: how long a claim or a heartbeat holds")
    heartbeat_s: PositiveSeconds = Field(description="H: how often the owner extends")
    missed_heartbeats: PositiveInt = Field(description="R: heartbeats that may fail in a row")
    reserve_s: Seconds = Field(description="J: reserve for jitter, pauses and the database")
    max_attempts: PositiveInt = Field(description="claims before the job fails for good")
    tool_timeout_s: PositiveSeconds = Field(description="the client timeout of one tool call")
    stage_time_limit_s: PositiveSeconds = Field(
        description="how long one attempt may take, whatever its lease says"
    )
    retry_backoff_s: Seconds = Field(
        1.0, description="the wait before the 2nd attempt; it doubles with each attempt after"
    )
    retry_backoff_max_s: Seconds = Field(300.0, description="the longest wait between attempts")

    def retry_delay_s(self, attempt: int, draw: float) -> float:
        """The wait before the attempt after `attempt` (which failed retryably), for a uniform
        `draw` in [0, 1): exponential, capped, with "equal jitter" (half fixed, half drawn), so
        that jobs that failed together (a provider outage) do not all come back together."""
        ceiling = min(self.retry_backoff_max_s, self.retry_backoff_s * 2.0 ** (attempt - 1))
        return ceiling / 2 + ceiling / 2 * draw

    @model_validator(mode="after")
    def _lease_outlasts_missed_heartbeats(self) -> Self:
        periods = self.missed_heartbeats + 1
        floor = periods * self.heartbeat_s + self.reserve_s
        if self.lease_s <= floor:
            raise ValueError(
                f"job class {self.name!r}: lease_s={self.lease_s:g} must be more than "
                f"(missed_heartbeats + 1) x heartbeat_s + reserve_s = {periods} x "
                f"{self.heartbeat_s:g} + {self.reserve_s:g} = {floor:g} (L > (R+1) x H + J): "
                f"after {self.missed_heartbeats} missed heartbeats the next one is sent "
                f"{periods} x {self.heartbeat_s:g}s after the last that succeeded, and must "
                f"still find the lease held"
            )
        return self

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.lease_s)


class Labels(BaseModel):
    """A job's bounded labels, carried as the events' `attrs` and split on by lease metrics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_class: Label | None = None
    model: Label | None = None
    provider: Label | None = None

    def attrs(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)
