"""`splitbrain ui`: a read-only findings view over the findings topic, until SIGTERM or Ctrl-C.

It reads the topic from its start as `tail` does (read_committed, no consumer group), keeps the
latest revision of each finding and its revisions, and serves them as HTML rendered on the
server (Starlette and uvicorn: the `ui` extra). Loopback by default; beyond loopback it needs
`--token-file`, or refuses to start. Its settings are flags and `SPLITBRAIN_UI_<NAME>` variables.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
from typing import Annotated, Final

from pydantic import AfterValidator, Field
from pydantic_settings import SettingsConfigDict

from detector.contracts.topics import FINDINGS_TOPIC
from detector.errors import ExitCode
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.settings import CommandSettings, Form, LogLevel, Name, Secret, SettingsError, flag
from detector.view.metrics import ViewMetrics
from detector.view.reader import FindingsReader
from detector.view.store import FindingsStore

UI_ENV_PREFIX: Final = "SPLITBRAIN_UI_"
MIN_TOKEN: Final = 16


def split_listen(value: str) -> tuple[str, int]:
    """`127.0.0.1:8080` or `[::1]:8080` as (address, port); a ValueError otherwise."""
    host, colon, port = value.rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError("no port")
    return str(ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))), int(port)


def _listen(value: str) -> str:
    split_listen(value)
    return value


Listen = Annotated[
    str,
    AfterValidator(_listen),
    Form("an IP address and port (127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080)", "ADDRESS:PORT"),
]


class UiSettings(CommandSettings):
    model_config = SettingsConfigDict(env_prefix=UI_ENV_PREFIX, frozen=True, extra="forbid")

    listen: Listen = Field(
        "127.0.0.1:8080",
        description="where the view listens; beyond loopback only with a token (port 0: any "
        "free port, printed)",
    )
    token: Secret = Field(
        None,
        description=f"the view's token (at least {MIN_TOKEN} characters; needed beyond loopback)",
    )
    findings_topic: Name = Field(FINDINGS_TOPIC, description="topic of finding revisions")
    log_level: LogLevel = Field("WARNING", description="log level (uvicorn's too)")

    def address(self) -> tuple[str, int, str | None]:
        """Where to listen, and the token; a `SettingsError` saying why not in one line."""
        host, port = split_listen(self.listen)
        token = None if self.token is None else self.token.get_secret_value()
        if token is not None and len(token) < MIN_TOKEN:
            raise SettingsError(
                f"{flag('token')}-file: the token has {len(token)} characters; use at least "
                f"{MIN_TOKEN} (e.g. openssl rand -hex 32)"
            )
        if token is None and not ipaddress.ip_address(host).is_loopback:
            raise SettingsError(
                f"refusing to listen on {self.listen} without a token: beyond loopback the "
                f"view needs {flag('token')}-file PATH (or {UiSettings.variable('token')})"
            )
        return host, port, token


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def run(args: argparse.Namespace) -> int:
    options = UiSettings.from_args(args)
    kafka = KafkaConnection.from_args(args).client_config()
    host, port, token = options.address()
    try:
        from detector.view.app import create_app, serve  # noqa: PLC0415 (the ui extra)
    except ImportError as exc:
        raise SettingsError(
            f"the view needs its extra ({exc.name} is missing): "
            "pip install 'splitbrain-detector[ui]'"
        ) from None
    logging.basicConfig(
        level=options.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    store = FindingsStore()
    sock = _bound(host, port)
    try:
        reader = FindingsReader(kafka, options.findings_topic, store)
        reader.start()
        where = f"{url_of(sock)} (findings of {options.findings_topic})"
        print(f"splitbrain ui: serving {where}", flush=True)
        try:
            serve(create_app(store, ViewMetrics(store), token=token), sock, options.log_level)
        finally:
            reader.stop()
    finally:
        sock.close()
    return ExitCode.OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "ui",
        help="a read-only findings view in the browser (the ui extra)",
        description="Read the findings topic from its start (read_committed, no consumer "
        "group) and serve the findings as HTML: open first, filters by severity, status and "
        "workflow, each finding at /findings/ID with its revisions and its timeline, and "
        "/findings/ID.html as one self-contained file for a ticket. /metrics (Prometheus) and "
        "/healthz (ready once the topic was read to its end). Loopback by default; beyond "
        "loopback every route but /healthz needs --token-file. Exit 0 after SIGTERM or Ctrl-C; "
        "2 when a setting, the topic or the cluster cannot be used.",
    )
    add_kafka_arguments(p)
    UiSettings.add_flags(
        p.add_argument_group(
            "view",
            f"each flag can also be set by its environment variable ({UI_ENV_PREFIX}...); the "
            "flag wins; the token comes only from its variable or a file",
        )
    )
    p.set_defaults(run=run)
