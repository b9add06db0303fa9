"""`splitbrain dev kafka start|stop|status`: the local broker of `detector.testing.kafka`.

Kept apart from `detector.testing.kafka` so that building the `splitbrain` parser imports nothing
heavier than argparse; the broker module is imported only when a `dev kafka` command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from detector.errors import ExitCode

DEFAULT_DATA_DIR = Path("var") / "kafka"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `dev kafka ...`, sharing the `dev` group if another module already created it."""
    kafka = _dev_group(subparsers).add_parser(
        "kafka",
        help="run a local single-node Kafka broker (KRaft) for development and tests",
        description="A real Apache Kafka broker from Maven Central jars, in the background.",
    )
    actions = kafka.add_subparsers(dest="kafka_command", required=True, metavar="ACTION")

    start = actions.add_parser(
        "start",
        help="start the broker in the background; the last line printed is bootstrap.servers=...",
    )
    _data_dir_arg(start)
    start.add_argument(
        "--kill",
        action="store_true",
        help="kill -9 the running broker and restart it on the same data and ports",
    )
    start.add_argument(
        "--sasl-ssl",
        action="store_true",
        help="client listener is SASL_SSL + SCRAM-SHA-512 (credentials in client.properties)",
    )
    start.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for metadata")
    start.set_defaults(run=_start)

    stop = actions.add_parser("stop", help="stop the broker by PID (SIGTERM, then SIGKILL)")
    _data_dir_arg(stop)
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    stop.set_defaults(run=_stop)

    status = actions.add_parser("status", help="is it running, and where (exit 0 if running)")
    _data_dir_arg(status)
    status.set_defaults(run=_status)


def _dev_group(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    existing = subparsers.choices.get("dev")
    if existing is not None:
        for action in existing._actions:
            if isinstance(action, argparse._SubParsersAction):
                group: argparse._SubParsersAction[argparse.ArgumentParser] = action
                return group
    dev = subparsers.add_parser("dev", help="developer tools (local infrastructure)")
    return dev.add_subparsers(dest="dev_command", required=True, metavar="TOOL")


def _data_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"the broker's directory: config, data, logs, pid (default: ./{DEFAULT_DATA_DIR})",
    )


def _start(args: argparse.Namespace) -> int:
    from detector.testing.kafka import DevKafkaError, LocalKafka  # noqa: PLC0415

    try:
        broker = LocalKafka(
            args.data_dir, sasl_ssl=True if args.sasl_ssl else None, start_timeout=args.timeout
        )
        if args.kill:
            if broker.pid() is None:
                print(f"error: --kill: no broker runs on {broker.data_dir}")
                return ExitCode.FAILED
            broker.kill_and_restart()
            print(f"killed and restarted (pid {broker.pid()})")
        elif broker.pid() is not None:
            print(f"already running (pid {broker.pid()})")
        else:
            broker.start()
            print(f"started (pid {broker.pid()}), log: {broker.log_path}")
    except DevKafkaError as exc:
        print(f"error: {exc}")
        return ExitCode.FAILED
    if broker.sasl_ssl:
        print(f"SASL_SSL {broker.sasl_username} (SCRAM-SHA-512), CA: {broker.ca_path}")
        print(f"client settings: {broker.data_dir / 'client.properties'}")
    print(f"bootstrap.servers={broker.bootstrap}")
    return ExitCode.OK


def _stop(args: argparse.Namespace) -> int:
    from detector.testing.kafka import DevKafkaError, LocalKafka  # noqa: PLC0415

    try:
        broker = LocalKafka(args.data_dir)
        pid = broker.pid()
        if broker.stop(timeout=args.timeout):
            print(f"stopped (pid {pid})")
        else:
            print(f"not running ({broker.data_dir})")
    except DevKafkaError as exc:
        print(f"error: {exc}")
        return ExitCode.FAILED
    return ExitCode.OK


def _status(args: argparse.Namespace) -> int:
    from detector.testing.kafka import LocalKafka  # noqa: PLC0415

    status = LocalKafka(args.data_dir).status()
    mode = "SASL_SSL" if status.sasl_ssl else "PLAINTEXT"
    if not status.running:
        print(f"not running ({status.data_dir})")
        return ExitCode.FAILED
    print(f"running pid={status.pid} {mode} data_dir={status.data_dir}")
    print(f"bootstrap.servers={status.bootstrap}")
    return ExitCode.OK
