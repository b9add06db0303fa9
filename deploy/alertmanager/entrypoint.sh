#!/bin/sh
# Alertmanager's entrypoint in docker-compose.yml. Alertmanager reads a secret from a file, never
# from its environment: write the PagerDuty routing key (PAGERDUTY_ROUTING_KEY, from .env) into
# the tmpfs /run/alertmanager, readable by Alertmanager's user only, then start Alertmanager
# with the arguments of the service's command.
set -eu
umask 077
printf '%s' "${PAGERDUTY_ROUTING_KEY:?set PAGERDUTY_ROUTING_KEY in .env}" \
    >/run/alertmanager/pagerduty-routing-key
unset PAGERDUTY_ROUTING_KEY
exec /bin/alertmanager "$@"
