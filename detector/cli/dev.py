"""`splitbrain dev kafka start|stop|status`: the local broker of `detector.devstack.kafka`;
`splitbrain dev up|down|status`: the whole stack of `detector.devstack.stack` (the one `splitbrain
demo` runs), left running for your own workers, its state in `var/dev/stack.json`.

Kept apart from `detector.devstack.kafka` so that building the `splitbrain` parser imports nothing
heavier than its flags' types; the broker and stack modules are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from detector.cli.arguments import add_stack_ports, argument_type, positive_seconds
from detector.errors import ExitCode, InputError, Interrupted
from detector.settings import Form

if TYPE_CHECKING:
    from detector.devstack.kafka import LocalKafka
    from detector.devstack.kafka_cluster import LocalKafkaCluster

DEFAULT_DATA_DIR = Path("var") / "kafka"
DEFAULT_STACK_DIR = Path("var") / "dev"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `dev kafka ...` and `dev up|down|status`, sharing the `dev` group if another module
    already created it."""
    group = _dev_group(subparsers)
    _register_stack(group)
    kafka = group.add_parser(
        "kafka",
        help="run a local Kafka broker, or a cluster (KRaft), for development and tests",
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
    _brokers_arg(start)
    start.add_argument(
        "--timeout",
        type=positive_seconds,
        default=90.0,
        metavar="S",
        help="seconds to wait for metadata",
    )
    start.set_defaults(run=_start)

    stop = actions.add_parser("stop", help="stop the broker by PID (SIGTERM, then SIGKILL)")
    _data_dir_arg(stop)
    stop.add_argument(
        "--timeout", type=positive_seconds, default=30.0, metavar="S", help="seconds before SIGKILL"
    )
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
        metavar="DIR",
        default=DEFAULT_DATA_DIR,
        help=f"the broker's directory: config, data, logs, pid (default: ./{DEFAULT_DATA_DIR})",
    )


def _quorum(count: int) -> int:
    if count != 1 and count < 3:
        raise ValueError("no quorum")
    return count


# `--brokers`: 1 (a single broker) or a cluster of 3 or more (a quorum survives one loss).
Brokers = Annotated[int, AfterValidator(_quorum), Form("1, or 3 or more (a KRaft quorum)", "N")]


def _brokers_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--brokers",
        type=argument_type(Brokers),
        default=1,
        metavar="N",
        help="1: a single broker; 3 or more: a KRaft cluster of combined broker-controller "
        "nodes, internal topics at replication 3 and min ISR 2 (PLAINTEXT only)",
    )


def _start_cluster(args: argparse.Namespace) -> int:
    from detector.devstack.kafka_cluster import LocalKafkaCluster  # noqa: PLC0415

    if args.sasl_ssl or args.kill:
        raise InputError("--brokers N > 1 takes neither --sasl-ssl nor --kill")
    cluster = LocalKafkaCluster(args.data_dir, brokers=args.brokers, start_timeout=args.timeout)
    cluster.start()
    print(f"started {len(cluster.nodes)} brokers, logs: {cluster.data_dir}/broker-*/logs")
    for node_id, pid in cluster.pids().items():
        print(f"broker.{node_id}.pid={pid}")
    print(f"bootstrap.servers={cluster.bootstrap}")
    return ExitCode.OK


def _start(args: argparse.Namespace) -> int:
    from detector.devstack.kafka import DevKafkaError, LocalKafka  # noqa: PLC0415
    from detector.devstack.kafka_cluster import is_cluster  # noqa: PLC0415

    if args.brokers > 1 or is_cluster(args.data_dir):
        return _start_cluster(args)
    broker = LocalKafka(
        args.data_dir, sasl_ssl=True if args.sasl_ssl else None, start_timeout=args.timeout
    )
    if args.kill:
        if broker.pid() is None:
            raise DevKafkaError(f"--kill: no broker runs on {broker.data_dir}")
        broker.kill_and_restart()
        print(f"killed and restarted (pid {broker.pid()})")
    elif broker.pid() is not None:
        print(f"already running (pid {broker.pid()})")
    else:
        broker.start()
        print(f"started (pid {broker.pid()}), log: {broker.log_path}")
    if broker.sasl_ssl:
        print(f"SASL_SSL {broker.sasl_username} (SCRAM-SHA-512), CA: {broker.ca_path}")
        print(f"client settings: {broker.data_dir / 'client.properties'}")
    print(f"bootstrap.servers={broker.bootstrap}")
    return ExitCode.OK


def _stop(args: argparse.Namespace) -> int:
    from detector.devstack.kafka_cluster import open_kafka  # noqa: PLC0415

    broker = open_kafka(args.data_dir)
    pids = ", ".join(str(p) for p in _pids(broker))
    if broker.stop(timeout=args.timeout):
        print(f"stopped (pid {pids})")
    else:
        print(f"not running ({broker.data_dir})")
    return ExitCode.OK


def _status(args: argparse.Namespace) -> int:
    from detector.devstack.kafka_cluster import LocalKafkaCluster, open_kafka  # noqa: PLC0415

    broker = open_kafka(args.data_dir)
    status = broker.status()
    mode = "SASL_SSL" if status.sasl_ssl else "PLAINTEXT"
    if not status.running:
        print(f"not running ({status.data_dir})")
        return ExitCode.FAILED
    pids = ",".join(str(p) for p in _pids(broker))
    print(f"running pid={pids} {mode} data_dir={status.data_dir}")
    if isinstance(broker, LocalKafkaCluster):
        for node_id, pid in broker.pids().items():
            print(f"broker.{node_id}.pid={pid if pid is not None else 'stopped'}")
    print(f"bootstrap.servers={status.bootstrap}")
    return ExitCode.OK


def _pids(broker: LocalKafka | LocalKafkaCluster) -> list[int]:
    """The running PIDs of a broker or of a cluster's nodes."""
    from detector.devstack.kafka_cluster import LocalKafkaCluster  # noqa: PLC0415

    if isinstance(broker, LocalKafkaCluster):
        return [pid for pid in broker.pids().values() if pid is not None]
    pid = broker.pid()
    return [] if pid is None else [pid]


# ---------------------------------------------------------------------------- the whole stack


def _register_stack(group: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = group.add_parser(
        "up",
        help="start the demo's stack and leave it running (stop it with `dev down`)",
        description="Start on loopback, each on a free port: Kafka (with the product's topics), "
        "PostgreSQL with the lease store, the example destination (unfenced unless --fenced), "
        "the outbox relay, two detector workers with /metrics, Alertmanager, Prometheus with "
        "the shipped rules, and the pager bridge; record them in STATE_DIR/stack.json and "
        "exit, leaving them running. A part whose Debian package is missing is skipped with "
        "one line. Exit 0: up; 1: a component failed (what started is stopped again); 2: "
        "cannot run here (no Java, a busy port, a stack already up); 130: interrupted.",
    )
    _stack_dir_arg(up)
    add_stack_ports(up)
    up.add_argument(
        "--fenced", action="store_true", help="the example destination enforces the fence"
    )
    _brokers_arg(up)
    up.add_argument(
        "--timeout",
        type=positive_seconds,
        default=180.0,
        metavar="S",
        help="seconds to start everything",
    )
    up.set_defaults(run=_up)

    down = group.add_parser(
        "down", help="stop, by PID, everything `dev up` started (exit 0 also if nothing ran)"
    )
    _stack_dir_arg(down)
    down.set_defaults(run=_down)

    status = group.add_parser(
        "status", help="what of the stack runs, and where (exit 0 if every component runs)"
    )
    _stack_dir_arg(status)
    status.set_defaults(run=_stack_status)


def _stack_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        default=DEFAULT_STACK_DIR,
        help=f"the stack's configs, data, logs and stack.json (default: ./{DEFAULT_STACK_DIR})",
    )


def _up(args: argparse.Namespace) -> int:
    from detector.devstack.errors import StackError, UnusableError  # noqa: PLC0415
    from detector.devstack.interrupts import interrupts  # noqa: PLC0415
    from detector.devstack.preflight import Options, preflight  # noqa: PLC0415
    from detector.devstack.record import STATE_FILE, load_record, locked, record_alive  # noqa: PLC0415
    from detector.devstack.stack import Stack  # noqa: PLC0415

    interrupts.install()
    options = Options(
        prometheus_port=args.prometheus_port,
        alertmanager_port=args.alertmanager_port,
        destination_port=args.destination_port,
        fenced=args.fenced,
        brokers=args.brokers,
    )
    try:
        with locked(args.state_dir, "splitbrain dev up"):
            record = load_record(args.state_dir)
            if record is not None and any(record_alive(record).values()):
                raise UnusableError(
                    f"a stack already runs in {args.state_dir}: `splitbrain dev status` shows "
                    "it, `splitbrain dev down` stops it"
                )
            tools = preflight(options, print)
            stack = Stack(
                args.state_dir, options, tools, mode="dev", say=print, timeout=args.timeout
            )
            stack.prepare()
            for skipped in stack.skipped:
                print(f"skipped {skipped.name}: {skipped.reason}")
            stack.start()
    except UnusableError:
        raise  # found before anything started
    except StackError as exc:
        exc.add_note("stopped what had started")
        raise
    except KeyboardInterrupt:
        raise Interrupted("interrupted; stopped what had started") from None
    print(f"up: {len(stack.components)} components, recorded in {stack.dir / STATE_FILE}")
    print("point your own workers and commands at it:")
    for name, value in stack.env().items():
        print(f"  export {name}={shlex.quote(value)}")
    print("`splitbrain dev status` shows it, `splitbrain dev down` stops it")
    return ExitCode.OK


def _down(args: argparse.Namespace) -> int:
    from detector.devstack.errors import StackError, UnusableError  # noqa: PLC0415
    from detector.devstack.interrupts import interrupts  # noqa: PLC0415
    from detector.devstack.record import locked, stop_recorded  # noqa: PLC0415

    interrupts.install()
    try:
        with locked(args.state_dir, "splitbrain dev down"), interrupts.ignored():
            stopped = stop_recorded(args.state_dir, print)
    except UnusableError as exc:  # another command holds the stack: `dev down` exits 1 on it
        raise StackError(str(exc)) from None
    if stopped:
        print(f"stopped {stopped} component(s) of {args.state_dir}")
    else:
        print(f"nothing runs in {args.state_dir}")
    return ExitCode.OK


def _stack_status(args: argparse.Namespace) -> int:
    from detector.devstack.record import load_record, record_alive  # noqa: PLC0415

    record = load_record(args.state_dir)
    if record is None:
        print(f"no stack in {args.state_dir} (start one with `splitbrain dev up`)")
        return ExitCode.FAILED
    alive = record_alive(record)
    for comp in record.get("components", []):
        pids = ",".join(str(p["pid"]) for p in comp.get("pids") or []) or "-"
        where = " ".join(f"{k}={v}" for k, v in (comp.get("urls") or {}).items())
        state = "running" if alive.get(comp["name"]) else "stopped"
        print(f"{comp['name']:<13} {state:<8} pid {pids:<8} {where}")
    for skipped in record.get("skipped", []):
        print(f"{skipped['name']:<13} skipped  {skipped['reason']}")
    running = sum(alive.values())
    print(f"{running} of {len(alive)} component(s) running in {args.state_dir}")
    return ExitCode.OK if alive and all(alive.values()) else ExitCode.FAILED
