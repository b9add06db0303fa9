"""librdkafka settings for every Kafka client of the project, from flags or the environment.

One module builds them so that `topics`, `replay`, `tail` and the emitter reach a cluster the same
way, and so that secrets have exactly one way in: the environment or a file, never a command-line
value, which `ps` and shell history would keep.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from confluent_kafka import KafkaError, KafkaException

from detector.errors import ExitCode, SplitbrainError

ENV_PREFIX: Final = "SPLITBRAIN_"

# Each is also a flag (`--security-protocol`) and an environment variable
# (`SPLITBRAIN_SECURITY_PROTOCOL`); the flag wins.
SETTINGS: Final = (
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.endpoint.identification.algorithm",
)
# Only from the environment (`SPLITBRAIN_SASL_PASSWORD`) or a file (`--sasl-password-file`).
SECRETS: Final = ("sasl.password", "ssl.key.password")

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


def env_name(key: str) -> str:
    return ENV_PREFIX + key.replace(".", "_").upper()


def _flag(key: str) -> str:
    return "--" + key.replace(".", "-")


def _dest(key: str) -> str:
    return key.replace(".", "_")


class _RefuseSecret(argparse.Action):
    """`--sasl-password VALUE` exists only to say no: without it, argparse would take it as an
    abbreviation of `--sasl-password-file` and read a file named after the password."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        key = self.dest.replace("_", ".")
        parser.error(
            f"{option_string} is not accepted: a secret on the command line leaks through ps and "
            f"shell history; set {env_name(key)} or pass {option_string}-file PATH"
        )


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection flags every Kafka command shares."""
    group = parser.add_argument_group(
        "Kafka connection",
        f"each flag can also be set by its environment variable ({ENV_PREFIX}...); the flag wins",
    )
    for key in SETTINGS:
        group.add_argument(
            _flag(key), dest=_dest(key), metavar="VALUE", help=f"{key} (env {env_name(key)})"
        )
    for key in SECRETS:
        group.add_argument(
            f"{_flag(key)}-file",
            dest=f"{_dest(key)}_file",
            metavar="PATH",
            help=f"read {key} from this file (or set env {env_name(key)})",
        )
        group.add_argument(
            _flag(key), dest=_dest(key), action=_RefuseSecret, help=argparse.SUPPRESS
        )


def client_config(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """librdkafka settings from the parsed flags and the environment, checked for the obvious.

    The result includes an `error_cb` that turns authentication and TLS failures into a
    `KafkaClientError` raised from the next `poll`/`flush`/`consume`, instead of a silent retry
    loop that ends in a timeout that says nothing about credentials.
    """
    env = os.environ if environ is None else environ
    conf: dict[str, Any] = {}
    for key in SETTINGS:
        value = getattr(args, _dest(key), None) or env.get(env_name(key))
        if value:
            conf[key] = value
    for key in SECRETS:
        secret = _read_secret(args, key, env)
        if secret is not None:
            conf[key] = secret
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


def _read_secret(args: argparse.Namespace, key: str, env: Mapping[str, str]) -> str | None:
    path = getattr(args, f"{_dest(key)}_file", None)
    if path is None:
        return env.get(env_name(key)) or None
    try:
        # A trailing newline is the editor's, not the password's.
        return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise KafkaClientError(
            f"cannot read {_flag(key)}-file {path}: {exc.strerror or exc}"
        ) from None


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


def describe(exc: KafkaException) -> str:
    """The message of a KafkaException, without the `KafkaError{code=...}` wrapper."""
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


Command = Callable[[argparse.Namespace], int]


def reports_kafka_errors(command: str) -> Callable[[Command], Command]:
    """Decorate a command's `run`: a Kafka problem becomes one readable line and exit status 2,
    not a traceback."""

    def decorate(run: Command) -> Command:
        @functools.wraps(run)
        def wrapped(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except KafkaClientError as exc:
                reason = str(exc)
            except KafkaException as exc:
                reason = describe(exc)
            print(f"splitbrain {command}: {reason}", file=sys.stderr)
            return ExitCode.UNUSABLE

        return wrapped

    return decorate
