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
from typing import Any

from detector.contracts.findings import Severity
from detector.contracts.page_state import SinkName
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.paging.alertmanager import AlertmanagerSink
from detector.paging.bridge import Bridge, BridgeSettings, Sink
from detector.paging.links import FindingLink
from detector.paging.metrics import PageMetrics
from detector.paging.pagerduty import PagerDutySink
from detector.paging.settings import PAGE_ENV_PREFIX, PageSettings
from detector.paging.state import SinkPolicy
from detector.paging.webhook import WebhookSink
from detector.settings import SettingsError, flag


class PageCommandSettings(PageSettings):
    """The command's checks across settings; its fields are `PageSettings`'."""

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

    def bridge_settings(self, kafka: dict[str, Any]) -> BridgeSettings:
        """What the bridge runs with, `kafka` from `KafkaConnection.client_config`."""
        sinks = self.sinks()
        if self.retry_max_s < self.retry_initial_s:
            raise SettingsError(
                f"{self.named('retry_max_s')}: expected at least {self.named('retry_initial_s')}"
            )
        policies = {
            name: SinkPolicy(Severity(getattr(self, f"{name.value}_min_severity")))
            for name in sinks
        }
        return BridgeSettings(page=self, kafka=kafka, sinks=sinks, policies=policies)


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
