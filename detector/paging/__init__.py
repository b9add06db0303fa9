"""The pager bridge (`splitbrain page`): finding revisions from `splitbrain.findings.v1` to
Alertmanager, PagerDuty Events v2 and a signed webhook, at least once, one incident per finding.

`record` is the state topic's contract, `state` the pure decisions (which revision is the
latest, what each sink must be sent), `alertmanager`, `pagerduty` and `webhook` build each sink's
requests (pure too); `delivery` posts them with retries, `store` writes the state topic (checked
and read back by `detector.kafka.stateful`, as the worker's changelog is) and `bridge` is the
consumer loop around all of them.
"""
