"""Job classes and their lease policy, and the bounded labels a job carries.

A job's lease and retries come from its class, never from the caller: a worker, or a model
choosing a tool, cannot ask for a longer lease or more attempts than the class allows. A class
whose numbers would let a live worker lose its lease to a few failed heartbeats is refused when
it is defined: L > H + R x max(H, T) + J. The heartbeat keeps its period from one extension's
send to the next's, unless an extension takes longer than a period: then the next is sent when it
returns. So after the last extension that succeeded, the first failed one is sent H later, each
of the R failed ones holds the next back by a period or by its own duration, at most T (the
extension timeout: the store connection's bounds), and the attempt after them must reach the
database before the lease runs out, with the reserve J for jitter, pauses and the database
(DESIGN §4's lease health, counted to the attempt that must succeed). Where failed extensions
fail fast (T <= H) this is L > (R+1) x H + J. With R >= 1 the rule also makes every heartbeat
"extend early": the first attempt after a success is sent with L - H > H + J left, a full period
and the reserve.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from detector.backoff import equal_jitter
from detector.contracts.events import ShortLabel
from detector.settings import PositiveInt, PositiveSeconds, Seconds

MAX_NAME_CHARS: Final = 128
# How long one extension can take to fail with the store connection's default bounds
# (`detector.leases.db`): a reconnect given up on after connect_timeout (10 s), then a statement,
# or a network gone silent, given up on after statement_timeout / tcp_user_timeout (10 s).
EXTEND_TIMEOUT_S: Final = 20.0

Label = Annotated[ShortLabel, Field(min_length=1)]


class JobClass(BaseModel):
    """The policy of one class of jobs (a tool such as `web_search` or `ocr`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    lease_s: PositiveSeconds = Field(description="L: how long a claim or a heartbeat holds")
    heartbeat_s: PositiveSeconds = Field(description="H: how often the owner extends")
    missed_heartbeats: PositiveInt = Field(description="R: heartbeats that may fail in a row")
    reserve_s: Seconds = Field(description="J: reserve for jitter, pauses and the database")
    extend_timeout_s: PositiveSeconds = Field(
        EXTEND_TIMEOUT_S,
        description=(
            "T: the longest one failed extension takes before the next is sent: the store "
            "connection's bounds (20 s by default; less where the DSN sets shorter timeouts, or "
            "where the database, on loopback, refuses at once rather than hangs)"
        ),
    )
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
        `draw` in [0, 1): `detector.backoff.equal_jitter`."""
        return equal_jitter(attempt, self.retry_backoff_s, self.retry_backoff_max_s, draw)

    @model_validator(mode="after")
    def _lease_outlasts_missed_heartbeats(self) -> Self:
        h, r, t, j = self.heartbeat_s, self.missed_heartbeats, self.extend_timeout_s, self.reserve_s
        floor = h + r * max(h, t) + j
        if self.lease_s <= floor:
            raise ValueError(
                f"job class {self.name!r}: lease_s={self.lease_s:g} must be more than "
                "heartbeat_s + missed_heartbeats x max(heartbeat_s, extend_timeout_s) + "
                f"reserve_s = {h:g} + {r} x max({h:g}, {t:g}) + {j:g} = {floor:g} "
                f"(L > H + R x max(H, T) + J): after the last heartbeat that succeeded, "
                f"{r} failed ones take a period each, or up to {t:g}s if an extension hangs, and "
                "the next one must still find the lease held"
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
