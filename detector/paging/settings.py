"""What the pager bridge needs to know: each setting declared once."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import SettingsConfigDict

from detector.contracts.topics import FINDINGS_TOPIC, PAGE_GROUP_ID, PAGE_STATE_TOPIC
from detector.paging.alertmanager import DEFAULT_RUNBOOK_URL
from detector.paging.links import FindingLink
from detector.paging.pagerduty import DEFAULT_URL as PAGERDUTY_URL
from detector.settings import (
    CommandSettings,
    Form,
    HttpUrl,
    IpAddress,
    LogLevel,
    Name,
    Port,
    PositiveSeconds,
    Seconds,
    Secret,
)

# Its own prefix, so that the bridge's variables cannot be confused with a worker's.
PAGE_ENV_PREFIX: Final = "SPLITBRAIN_PAGE_"


def _finding_url(value: str | None) -> str | None:
    if value is not None:
        FindingLink(value)  # raises ValueError, said as the flag's error
    return value


FindingUrl = Annotated[
    str | None,
    AfterValidator(_finding_url),
    Form("an http(s) URL template holding {finding_id} once", "URL"),
]
MinSeverity = Annotated[Literal["info", "warning", "critical"], BeforeValidator(str.lower)]


class PageSettings(CommandSettings):
    """The one declaration of the pager bridge's settings: each field is also a `splitbrain page`
    flag and a `SPLITBRAIN_PAGE_` variable, checked by its type, its description the flag's help
    and the configuration reference. The bridge reads them from here; the command
    (`detector.cli.page`) adds the checks across settings and builds the sinks."""

    model_config = SettingsConfigDict(env_prefix=PAGE_ENV_PREFIX, frozen=True, extra="forbid")

    alertmanager_url: HttpUrl = Field(
        None, description="Alertmanager's URL (API v2): one alert per open finding"
    )
    alertmanager_resend_interval_s: PositiveSeconds = Field(
        60.0,
        description="send every open finding to Alertmanager again this often, in seconds; "
        "keep it well below Alertmanager's resolve_timeout (5m by default)",
    )
    alertmanager_min_severity: MinSeverity = Field(
        "info", description="the lowest finding severity sent to Alertmanager"
    )
    pagerduty_routing_key: Secret = Field(
        None, description="the PagerDuty Events v2 routing key (it turns the PagerDuty sink on)"
    )
    pagerduty_url: HttpUrl = Field(PAGERDUTY_URL, description="PagerDuty's Events API v2 endpoint")
    pagerduty_min_severity: MinSeverity = Field(
        "info", description="the lowest finding severity sent to PagerDuty"
    )
    webhook_url: HttpUrl = Field(None, description="a URL to POST every new finding revision to")
    webhook_secret: Secret = Field(
        None, description="the webhook's HMAC-SHA256 key (X-Splitbrain-Signature)"
    )
    webhook_min_severity: MinSeverity = Field(
        "info", description="the lowest finding severity sent to the webhook"
    )
    runbook_url: Name = Field(
        DEFAULT_RUNBOOK_URL, description="runbook_url of the alerts and PagerDuty events"
    )
    finding_url: FindingUrl = Field(
        None,
        description="a link to each finding, {finding_id} replaced by its id (e.g. "
        "https://splitbrain.example/findings/{finding_id}): Alertmanager's generatorURL and "
        "finding_url annotation, PagerDuty's links, the webhook's X-Splitbrain-Finding-Url",
    )
    findings_topic: Name = Field(FINDINGS_TOPIC, description="topic of finding revisions")
    state_topic: Name = Field(
        PAGE_STATE_TOPIC,
        description="the bridge's compacted state topic (created if missing, co-partitioned "
        "with the findings topic)",
    )
    group_id: Name = Field(PAGE_GROUP_ID, description="the bridge's consumer group")
    http_timeout_s: PositiveSeconds = Field(10.0, description="timeout of one request, in seconds")
    retry_initial_s: PositiveSeconds = Field(
        0.5, description="first wait before a delivery is sent again, in seconds (then doubled)"
    )
    retry_max_s: PositiveSeconds = Field(
        60.0, description="longest wait between two tries of a delivery, in seconds"
    )
    resolved_retention_s: Seconds = Field(
        1_209_600,
        description="how long a resolved finding is remembered (then tombstoned), in seconds; "
        "at least the findings topic's retention, so that an old revision read again is known",
    )
    shutdown_timeout_s: Seconds = Field(
        30.0, description="on SIGTERM, how long deliveries in flight may still take, in seconds"
    )
    metrics_port: Port = Field(0, description="serve /metrics on this port (0: off)")
    metrics_address: IpAddress = Field(
        "127.0.0.1",
        description="the address /metrics listens on; 0.0.0.0 (or ::) for a scraper in another "
        "container or host, behind a network policy or firewall",
    )
    log_level: LogLevel = Field("INFO", description="log level")
