"""The Kafka connection of every client of the project: one settings model, from flags or the
environment.

`KafkaConnection` is what `topics`, `replay`, `tail`, `worker`, `page`, `ui`, `watch`, the outbox
relay and the emitter reach a cluster with, so they reach it the same way; a library builds it
from the environment alone (`KafkaConnection.from_env()`), a command from its flags too. Secrets
have exactly one way in: the environment or a file, never a command-line value, which `ps` and
shell history would keep (`detector.settings` reads both).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Final, Protocol

from confluent_kafka import KafkaError, KafkaException
from pydantic import Field, SecretStr

from detector.errors import ExitCode, SplitbrainError
from detector.settings import ENV_PREFIX as ENV_PREFIX  # noqa: PLC0414 (re-exported)
from detector.settings import CommandSettings, Secret, Text, env_var

# librdkafka retries everything forever; these errors no retry can fix.
_UNRECOVERABLE: Final = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)


class KafkaClientError(SplitbrainError, RuntimeError):
    """A Kafka client cannot be configured or cannot do its job; the message says why."""

    exit_code = ExitCode.UNUSABLE


def _key(field: str) -> str:
    return field.replace("_", ".")


def env_name(key: str) -> str:
    """The variable of a librdkafka setting: `sasl.password` is `SPLITBRAIN_SASL_PASSWORD`."""
    return env_var(key.replace(".", "_"))


class KafkaConnection(CommandSettings):
    """Where the cluster is and how to authenticate to it. Each field is the librdkafka setting
    of the same name with dots (`bootstrap_servers` is `bootstrap.servers`), a flag
    (`--bootstrap-servers`) and a variable (`SPLITBRAIN_BOOTSTRAP_SERVERS`); the two secrets come
    only from their variable or a file (`--sasl-password-file`)."""

    bootstrap_servers: Text = Field(None, description="bootstrap.servers")
    security_protocol: Text = Field(None, description="security.protocol")
    sasl_mechanism: Text = Field(None, description="sasl.mechanism")
    sasl_username: Text = Field(None, description="sasl.username")
    ssl_ca_location: Text = Field(None, description="ssl.ca.location")
    ssl_certificate_location: Text = Field(None, description="ssl.certificate.location")
    ssl_key_location: Text = Field(None, description="ssl.key.location")
    ssl_endpoint_identification_algorithm: Text = Field(
        None, description="ssl.endpoint.identification.algorithm"
    )
    sasl_password: Secret = Field(None, description="sasl.password")
    ssl_key_password: Secret = Field(None, description="ssl.key.password")

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings, checked for the obvious.

        The result includes an `error_cb` that turns authentication and TLS failures into a
        `KafkaClientError` raised from the next `poll`/`flush`/`consume`, instead of a silent
        retry loop that ends in a timeout that says nothing about credentials.
        """
        conf: dict[str, Any] = {
            _key(name): value.get_secret_value() if isinstance(value, SecretStr) else value
            for name, value in self
            if value is not None
        }
        if "bootstrap.servers" not in conf:
            raise KafkaClientError(
                "no Kafka cluster given: pass --bootstrap-servers or set "
                + env_name("bootstrap.servers")
            )
        if "sasl.username" in conf and "sasl.password" not in conf:
            raise KafkaClientError(
                f"sasl.username is set but no password: set {env_name('sasl.password')} "
                "or pass --sasl-password-file"
            )
        conf["error_cb"] = raise_unrecoverable
        return conf


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection flags every Kafka command shares, in a group of their own."""
    KafkaConnection.add_flags(
        parser.add_argument_group(
            "Kafka connection",
            f"each flag can also be set by its environment variable ({ENV_PREFIX}...); "
            "the flag wins",
        )
    )


def raise_unrecoverable(err: KafkaError) -> None:
    """librdkafka's `error_cb`: raise what retrying cannot fix; librdkafka logs the rest itself."""
    if err.fatal() or err.code() in _UNRECOVERABLE:
        raise KafkaClientError(f"Kafka: {err.str()}")


class _Client(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...

    def poll(self, timeout: float = -1) -> Any: ...


def fetch_metadata(client: _Client, timeout: float, topic: str | None = None) -> Any:
    """Cluster metadata, or a `KafkaClientError` naming the reason.

    `list_topics` does not serve `error_cb`, so it is asked in short rounds with a `poll(0)`
    between them: a wrong password or CA then fails within about a second with its cause, not
    after the whole timeout as "transport failure". Call it before a consumer is assigned, so the
    poll cannot take a message.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.1, min(1.0, remaining)))
        except KafkaException as exc:
            client.poll(0)
            if remaining <= 1.0:
                raise KafkaClientError(
                    f"no metadata from Kafka within {timeout:g}s: {describe(exc)}"
                ) from None


def error_of(exc: KafkaException) -> KafkaError | None:
    """The error a KafkaException carries (librdkafka's always does; one raised by hand may not)."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def describe(exc: KafkaException) -> str:
    """The message of a KafkaException, without the `KafkaError{code=...}` wrapper."""
    err = error_of(exc)
    return str(exc) if err is None else err.str()
