"""librdkafka security settings, as faust (aiokafka) credentials."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Final, cast

import faust
from faust.auth import SASLCredentials
from faust.types.auth import CredentialsT

from detector.runtime.faust.barrier import FaustRuntimeError

_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def broker_credentials(kafka: Mapping[str, Any]) -> CredentialsT | None:
    """librdkafka security settings as faust credentials (aiokafka underneath)."""
    protocol = str(kafka.get("security.protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return None
    context: ssl.SSLContext | None = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=kafka.get("ssl.ca.location") or None)
        cert = kafka.get("ssl.certificate.location")
        if cert:
            context.load_cert_chain(
                cert, kafka.get("ssl.key.location") or None, kafka.get("ssl.key.password")
            )
        if str(kafka.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
            context.check_hostname = False
    if protocol == "SSL":
        assert context is not None
        return cast(CredentialsT, faust.SSLCredentials(context))
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = str(kafka.get("sasl.mechanism", "PLAIN")).upper()
        if mechanism not in _SASL_MECHANISMS:
            raise FaustRuntimeError(f"sasl.mechanism {mechanism!r} is not supported here")
        return cast(
            CredentialsT,
            SASLCredentials(
                username=kafka.get("sasl.username"),
                password=kafka.get("sasl.password"),
                ssl_context=context,
                mechanism=mechanism,
            ),
        )
    raise FaustRuntimeError(f"security.protocol {protocol!r} is not supported")
