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

A class whose jobs differ by tool, model or provider declares the values each may take
(`LabelValues`): the live gauges split the class by those labels, and only by those, so their
series stay as few as the declarations (at most `MAX_LABEL_SETS` a class); a job of the class
carrying another value is refused at enqueue rather than counted under a label nobody declared.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from detector.backoff import equal_jitter
from detector.contracts.events import ShortLabel
from detector.leases.errors import LeaseInputError
from detector.settings import PositiveInt, PositiveSeconds, Seconds

MAX_NAME_CHARS: Final = 128
# How long one extension can take to fail with the store connection's default bounds
# (`detector.leases.db`): a reconnect given up on after connect_timeout (10 s), then a statement,
# or a network gone silent, given up on after statement_timeout / tcp_user_timeout (10 s).
EXTEND_TIMEOUT_S: Final = 20.0

# The label combinations one class may split its live gauges into (each is a series per gauge).
MAX_LABEL_SETS: Final = 64

Label = Annotated[ShortLabel, Field(min_length=1)]


class LabelValues(BaseModel):
    """The values each label of a class's jobs may take, given for the labels its jobs differ by
    (the rest left empty): what the live gauges split the class by."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_class: frozenset[Label] = frozenset()
    model: frozenset[Label] = frozenset()
    provider: frozenset[Label] = frozenset()

    def declared(self) -> dict[str, frozenset[str]]:
        return {name: values for name, values in self if values}

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        sets = math.prod(len(values) for values in self.declared().values())
        if sets > MAX_LABEL_SETS:
            raise ValueError(
                f"{sets} label combinations; a class may split its gauges into {MAX_LABEL_SETS}"
            )
        return self


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
    labels: LabelValues = Field(
        default_factory=LabelValues,
        description="the tool classes, models and providers its jobs differ by, if any",
    )

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

    def gauge_labels(self, labels: Labels) -> dict[str, str]:
        """The labels a job of the class is counted under in the live gauges: its value of each
        label the class declares; `LeaseInputError` naming the label if it is not declared."""
        given = labels.attrs()
        counted: dict[str, str] = {}
        for name, values in self.labels.declared().items():
            value = given.get(name)
            if value is None or value not in values:
                raise LeaseInputError(
                    name,
                    f"job class {self.name!r} declares {', '.join(sorted(values))}; got {value!r}",
                )
            counted[name] = value
        return counted


class Labels(BaseModel):
    """A job's bounded labels, carried as the events' `attrs` and split on by lease metrics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_class: Label | None = None
    model: Label | None = None
    provider: Label | None = None

    def attrs(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)
