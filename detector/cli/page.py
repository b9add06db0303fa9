"""`splitbrain page`: the pager bridge, from the findings topic to Alertmanager, PagerDuty Events
v2 and a signed webhook, until SIGTERM.

Its settings are flags and `SPLITBRAIN_PAGE_<NAME>` variables (the flag wins), so that they
cannot be confused with a worker's; the Kafka connection is every Kafka command's
(`--bootstrap-servers`, `SPLITBRAIN_BOOTSTRAP_SERVERS`, …). The PagerDuty routing key and the
webhook secret come only from their variable or a file (`--pagerduty-routing-key-file`), never
from a flag's value, which `ps` and shell history keep.
"""

from __future__ import annotations

import argparse
import logging
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import SettingsConfigDict

from detector.contracts.findings import Severity
from detector.contracts.page_state import SinkName
from detector.contracts.topics import FINDINGS_TOPIC, PAGE_GROUP_ID, PAGE_STATE_TOPIC
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.paging.alertmanager import DEFAULT_RUNBOOK_URL, AlertmanagerSink
from detector.paging.bridge import Bridge, BridgeSettings, Sink
from detector.paging.delivery import Backoff
from detector.paging.links import FindingLink
from detector.paging.metrics import PageMetrics
from detector.paging.pagerduty import DEFAULT_URL as PAGERDUTY_URL
from detector.paging.pagerduty import PagerDutySink
from detector.paging.state import SinkPolicy
from detector.paging.webhook import WebhookSink
from detector.settings import (
    CommandSettings,
    Form,
    IpAddress,
    LogLevel,
    Name,
    Port,
    PositiveSeconds,
    Seconds,
    Secret,
    SettingsError,
    flag,
)

PAGE_ENV_PREFIX: Final = "SPLITBRAIN_PAGE_"


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in a URL would show in ps and in logs")
    return value


def _finding_url(value: str | None) -> str | None:
    if value is not None:
        FindingLink(value)  # raises ValueError, said as the flag's error
    return value


FindingUrl = Annotated[
    str | None,
    AfterValidator(_finding_url),
    Form("an http(s) URL template holding {finding_id} once", "URL"),
]
Url = Annotated[
    str | None,
    AfterValidator(_http_url),
    Form("an http:// or https:// URL without credentials", "URL"),
]
MinSeverity = Annotated[Literal["info", "warning", "critical"], BeforeValidator(str.lower)]


class _PageSettings(CommandSettings):
    model_config = SettingsConfigDict(env_prefix=PAGE_ENV_PREFIX, frozen=True, extra="forbid")


class PageCommandSettings(_PageSettings):
    alertmanager_url: Url = Field(
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
    pagerduty_url: Url = Field(PAGERDUTY_URL, description="PagerDuty's Events API v2 endpoint")
    pagerduty_min_severity: MinSeverity = Field(
        "info", description="the lowest finding severity sent to PagerDuty"
    )
    webhook_url: Url = Field(None, description="a URL to POST every new finding revision to")
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

    def sinks(self) -> dict[SinkName, Sink]:
        """The sinks the settings turn on; a `SettingsError` when there is none."""
        out: dict[SinkName, Sink] = {}
        link = None if self.finding_url is None else FindingLink(self.finding_url)
        if self.alertmanager_url is not None:
            out[SinkName.ALERTMANAGER] = AlertmanagerSink(
                self.alertmanager_url, self.runbook_url, link
            )
        if self.pagerduty_routing_key is not None:
            assert self.pagerduty_url is not None
            out[SinkName.PAGERDUTY] = PagerDutySink(
                self.pagerduty_routing_key, self.pagerduty_url, self.runbook_url, link
            )
        if self.webhook_url is not None:
            out[SinkName.WEBHOOK] = WebhookSink(self.webhook_url, self.webhook_secret, link)
        elif self.webhook_secret is not None:
            raise SettingsError(
                f"a webhook secret is set but no webhook: pass {flag('webhook_url')} or set "
                f"{self.variable('webhook_url')}"
            )
        if not out:
            raise SettingsError(
                f"no sink: pass {flag('alertmanager_url')} or {flag('webhook_url')}, or set "
                f"{self.variable('pagerduty_routing_key')} (or pass "
                f"{flag('pagerduty_routing_key')}-file)"
            )
        return out

    def policies(self, sinks: dict[SinkName, Sink]) -> dict[SinkName, SinkPolicy]:
        return {
            name: SinkPolicy(Severity(getattr(self, f"{name.value}_min_severity")))
            for name in sinks
        }

    def bridge_settings(self, kafka: dict[str, Any]) -> BridgeSettings:
        sinks = self.sinks()
        if self.retry_max_s < self.retry_initial_s:
            raise SettingsError(
                f"{self.named('retry_max_s')}: expected at least {self.named('retry_initial_s')}"
            )
        secrets = tuple(
            s.get_secret_value()
            for s in (self.pagerduty_routing_key, self.webhook_secret)
            if s is not None
        )
        return BridgeSettings(
            kafka=kafka,
            findings_topic=self.findings_topic,
            state_topic=self.state_topic,
            group_id=self.group_id,
            sinks=sinks,
            policies=self.policies(sinks),
            resend_interval_s=self.alertmanager_resend_interval_s,
            http_timeout_s=self.http_timeout_s,
            backoff=Backoff(self.retry_initial_s, self.retry_max_s),
            resolved_retention_s=self.resolved_retention_s,
            shutdown_timeout_s=self.shutdown_timeout_s,
            secrets=secrets,
        )


def run(args: argparse.Namespace) -> int:
    options = PageCommandSettings.from_args(args)
    settings = options.bridge_settings(KafkaConnection.from_args(args).client_config())
    logging.basicConfig(
        level=options.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    metrics = PageMetrics(settings.sinks)
    if options.metrics_port:
        metrics.serve(options.metrics_port, options.metrics_address)
    return Bridge(settings, metrics).run()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "page",
        help="the pager bridge: findings to Alertmanager, PagerDuty and a webhook",
        description="Consume the findings topic (read_committed) in its own consumer group, keep "
        "the latest revision of each finding and send what changed to each sink, at least "
        "once: one Alertmanager alert per open finding (re-sent on an interval), one PagerDuty "
        "incident per finding (dedup_key = finding_id), every revision to a signed webhook. "
        "Offsets are committed once every sink took the batch. Exit 0 after SIGTERM; 2 when "
        "a setting, the topics or the cluster cannot be used.",
    )
    add_kafka_arguments(p)
    PageCommandSettings.add_flags(
        p.add_argument_group(
            "paging",
            f"each flag can also be set by its environment variable ({PAGE_ENV_PREFIX}...); "
            "the flag wins; the two secrets come only from their variable or a file",
        )
    )
    p.set_defaults(run=run)
