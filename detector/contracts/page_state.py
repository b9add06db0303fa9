"""The contract of the pager bridge's state topic `splitbrain.page-state.v1`.

One record per finding, key = `finding_id`, in the partition of the findings topic the finding's
revisions are in (the two topics are co-partitioned, so a bridge that is assigned a findings
partition restores exactly the state of the findings in it). The value is the latest revision the
bridge saw, when it first saw the finding, and what each sink last accepted; a tombstone (null
value) forgets a finding once it is resolved, delivered, and older than the retention of the
findings topic. The topic is compacted: its size is the number of findings the bridge remembers.

Readers ignore fields they do not know, so that a later bridge can add some.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from detector.contracts.findings import Finding, Severity, Status

SCHEMA: Final = "splitbrain.page-state/v1"


# What a sink's answer to a delivery settled: it took it, or refused it for good.
SentOutcome = Literal["accepted", "dead_letter"]


class SinkName(StrEnum):
    ALERTMANAGER = "alertmanager"
    PAGERDUTY = "pagerduty"
    WEBHOOK = "webhook"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class Sent(_Record):
    """What one sink last took for a finding: the revision and the facts it shows."""

    revision: int = Field(ge=1)
    status: Status
    severity: Severity
    condition: str = Field(description="the alert's `condition` label as sent")
    outcome: SentOutcome = Field(
        description="dead_letter: the sink refused it (4xx); the next change is sent again"
    )
    at: AwareDatetime = Field(description="when the sink answered, on the bridge's clock")


class PageStateRecord(_Record):
    schema_: Literal["splitbrain.page-state/v1"] = Field(default=SCHEMA, alias="schema")
    finding: Finding = Field(description="the latest revision the bridge saw")
    first_seen_at: AwareDatetime = Field(
        description="Kafka timestamp of the first revision the bridge saw: the alert's startsAt"
    )
    revision_at: AwareDatetime = Field(
        description="Kafka timestamp of the latest revision (its endsAt once resolved)"
    )
    sent: dict[SinkName, Sent] = Field(default_factory=dict)

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()
