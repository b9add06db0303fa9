"""`splitbrain leases`: the fenced PostgreSQL lease store of the job-queue practice.

`migrate` creates or updates its tables; `inspect` shows who owns which running job and flags
the leases that expired; `cancel` stops a job as an ordered, fencing transition; `prune` deletes
finished jobs and relayed outbox rows past a horizon (the relay also does, on its schedule).
The database is named by `--dsn` (also `--leases-dsn`) or `SPLITBRAIN_LEASES_DSN`, a libpq
connection string. A password never goes into a DSN given
on the command line, which `ps` and shell history keep: libpq reads it from PGPASSWORD or
~/.pgpass, or the whole DSN can come from the variable.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Annotated, Any, Final
from uuid import UUID, uuid4

from pydantic import AfterValidator, Field

from detector.cli.arguments import argument_type, port, positive_int, positive_seconds
from detector.cli.main import silence_stdout
from detector.contracts.topics import DLQ_TOPIC, INPUT_TOPIC
from detector.errors import ExitCode
from detector.kafka.config import KafkaConnection, add_kafka_arguments
from detector.report import count, printable
from detector.settings import CommandSettings, Form, IpAddress, SettingsError, env_var, flag

if TYPE_CHECKING:
    from detector.leases.inspect import ClassView, Inspection, RunningJob

# psycopg, and the lease store with it, is imported where it is used: importing it costs every
# `splitbrain` command 0.1 s.


def _conninfo(dsn: str) -> dict[str, str | int | None]:
    """The DSN's parameters; a `ValueError` with libpq's reason if it does not parse."""
    import psycopg.conninfo  # noqa: PLC0415

    try:
        return psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ValueError(str(exc)) from None


def _parses(dsn: str | None) -> str | None:
    if dsn is not None:
        _conninfo(dsn)
    return dsn


Dsn = Annotated[
    str | None,
    AfterValidator(_parses),
    Form("a libpq connection string (host=H port=P dbname=D, or postgresql://H:P/D)", "DSN"),
]


class LeasesSettings(CommandSettings):
    leases_dsn: Dsn = Field(None, description="the lease store's PostgreSQL database")

    def dsn(self, args: argparse.Namespace) -> str:
        """The DSN; a missing one, or a password on the command line, is a `SettingsError`."""
        if self.leases_dsn is None:
            raise SettingsError(f"no database given: pass --dsn or set {env_var('leases_dsn')}")
        if hasattr(args, "leases_dsn") and "password" in _conninfo(self.leases_dsn):
            raise SettingsError(
                "--dsn holds a password, which ps and shell history keep: put it in "
                f"PGPASSWORD or ~/.pgpass, or give the DSN in {env_var('leases_dsn')}"
            )
        return self.leases_dsn


def run_migrate(args: argparse.Namespace) -> int:
    from detector.leases.db import connect  # noqa: PLC0415
    from detector.leases.schema import LANGGRAPH, migrate  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    with connect(dsn) as conn:
        run = migrate(conn, only=LANGGRAPH if args.langgraph else None)
    for step in run.applied:
        print(f"applied migration {step.version}: {step.name}")
    print(
        f"schema at version {run.version}"
        + ("" if run.applied else ": already current, nothing changed")
    )
    return ExitCode.OK


def run_relay(args: argparse.Namespace) -> int:
    """Relay until SIGTERM or SIGINT; what is published and not yet marked goes out again on
    the next start, under the same event ids."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415
    from datetime import timedelta  # noqa: PLC0415

    from prometheus_client import start_http_server  # noqa: PLC0415

    from detector.leases.gauges import LeaseGauges  # noqa: PLC0415
    from detector.leases.relay import OutboxRelay  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    kafka = KafkaConnection.from_args(args).client_config()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    relay = OutboxRelay(
        dsn,
        kafka,
        topic=args.topic,
        dlq_topic=args.dlq_topic,
        batch=args.batch,
        retention=timedelta(hours=args.retention_h),
        job_retention=timedelta(hours=args.job_retention_h),
        gauges=LeaseGauges() if args.metrics_port else None,
    )
    if relay.gauges is not None:
        start_http_server(
            args.metrics_port, addr=args.metrics_address, registry=relay.gauges.registry
        )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        relay.run(stop)
    finally:
        relay.close()
    print(f"relayed {relay.published} event(s) to {args.topic}", file=sys.stderr)
    if relay.dead_lettered:
        print(f"sent {relay.dead_lettered} invalid row(s) to {args.dlq_topic}", file=sys.stderr)
    return ExitCode.OK


def run_maintain(args: argparse.Namespace) -> int:
    """Keep the store until SIGTERM or SIGINT: retention, and the gauges on /metrics."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415
    from datetime import timedelta  # noqa: PLC0415

    from prometheus_client import start_http_server  # noqa: PLC0415

    from detector.leases.gauges import LeaseGauges  # noqa: PLC0415
    from detector.leases.maintenance import Upkeep, maintain  # noqa: PLC0415
    from detector.leases.store import LeaseStore  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    upkeep = Upkeep(
        job_retention=timedelta(hours=args.job_retention_h),
        outbox_retention=timedelta(hours=args.outbox_retention_h),
        relayed_only=not args.without_relay,
        prune_every_s=args.prune_every_s,
    )
    gauges = LeaseGauges()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LeaseStore(dsn, ()) as store:
        if args.metrics_port:
            start_http_server(
                args.metrics_port, addr=args.metrics_address, registry=gauges.registry
            )
        maintain(store, upkeep, gauges, stop)
    return ExitCode.OK


def run_cancel(args: argparse.Namespace) -> int:
    """Exit 0: cancelled; 1: not queued or running (finished already, or no such job)."""
    from detector.leases.store import LeaseStore  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    with LeaseStore(dsn, ()) as store:
        job = store.cancel(args.job, by=args.by)
        if job is None:
            found = store.job(args.job)
    if job is None:
        state = "no such job" if found is None else f"it is {found.state}"
        print(f"splitbrain leases cancel: {args.job} not cancelled: {state}", file=sys.stderr)
        return ExitCode.FAILED
    print(
        f"cancelled job {job.id} (token now {job.fencing_token}, held by {printable(args.by)}): "
        "a running owner's writes, and its fence at a fenced destination, are refused"
    )
    return ExitCode.OK


def run_prune(args: argparse.Namespace) -> int:
    from datetime import timedelta  # noqa: PLC0415

    from detector.leases.store import LeaseStore  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    with LeaseStore(dsn, ()) as store:
        pruned = store.prune(timedelta(hours=args.older_than), relayed_only=not args.without_relay)
    print(
        f"pruned {count(pruned.jobs, 'finished job')}, {count(pruned.outbox_rows, 'outbox row')}"
        f" and {count(pruned.receipts, 'destination receipt')} older than {args.older_than}h"
    )
    return ExitCode.OK


def run_destination(args: argparse.Namespace) -> int:
    """Serve the example destination until SIGTERM or SIGINT, with two jobs to probe it with."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from detector.leases.errors import StoreUnavailableError  # noqa: PLC0415
    from detector.leases.http_destination import DestinationServer  # noqa: PLC0415
    from detector.leases.policy import JobClass  # noqa: PLC0415
    from detector.leases.store import Lease, LeaseStore  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The two jobs `probe` names, of this run, each running under a token the store issued: the
    # first at 2 (claimed, its attempt failed, claimed again), the second at 1. Cancelled when
    # the service stops; a job of an earlier run that was not (killed) is failed on the way.
    probe = JobClass(
        name="splitbrain-probe",
        lease_s=90,
        heartbeat_s=10,
        missed_heartbeats=2,
        reserve_s=10,
        max_attempts=2,
        retry_backoff_s=0,
        tool_timeout_s=10,
        stage_time_limit_s=60,
    )
    run = uuid4().hex[:12]
    with LeaseStore(dsn, [probe]) as store:

        def claim(wanted: UUID) -> Lease:
            while True:
                lease = store.claim(probe.name, "splitbrain-probe")
                if lease is None:
                    raise StoreUnavailableError(f"the probe's job {wanted} could not be claimed")
                if lease.job_id == wanted:
                    return lease
                store.fail(lease, {"reason": "a probe job of an earlier run"}, retryable=False)

        def enqueue(which: str) -> UUID:
            return store.enqueue(probe.name, f"{probe.name}:{args.name}:{run}:{which}", {}).id

        first = enqueue("first")
        store.fail(claim(first), {"reason": "to take the next token"}, retryable=True)
        leases = (claim(first), claim(enqueue("second")))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    mode = "UNFENCED: a displaced owner's effect lands" if args.unfenced else "fenced"
    one, two = leases
    try:
        with DestinationServer(
            dsn, args.name, fenced=not args.unfenced, host=args.host, port=args.port
        ) as server:
            print(f"listening on {server.url} ({mode}, destination {printable(args.name)})")
            print(
                f"probe it: splitbrain probe {server.url} --job {one.job_id} "
                f"--fence {one.fencing_token} --second-job {two.job_id} "
                f"--second-fence {two.fencing_token}",
                flush=True,
            )
            stop.wait()
    finally:
        with LeaseStore(dsn, [probe]) as store:
            for lease in leases:
                store.cancel(lease.job_id, by="splitbrain-probe")
    return ExitCode.OK


# The contract of `inspect --format json`: a new field may be added, none renamed or removed.
INSPECT_SCHEMA: Final = "splitbrain.leases-inspect/v1"


def run_inspect(args: argparse.Namespace) -> int:
    from detector.leases.db import connect  # noqa: PLC0415
    from detector.leases.inspect import inspect_leases  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    with connect(dsn) as conn:
        view = inspect_leases(conn, job_class=args.job_class, limit=args.limit)
    # 1 when any running lease expired, so that a cron or CI check can act on the exit status.
    status = ExitCode.FAILED if view.expired else ExitCode.OK
    try:
        if args.format == "json":
            print(json.dumps(inspection_json(view), separators=(",", ":")))
        else:
            for line in inspection_lines(view):
                print(printable(line))
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
    return status


def inspection_json(view: Inspection) -> dict[str, Any]:
    """The document `--format json` prints (docs/lease-store/inspect.md)."""
    return {
        "schema": INSPECT_SCHEMA,
        "observed_at": view.observed_at.astimezone(UTC).isoformat(timespec="microseconds"),
        "job_class": view.job_class,
        "limit": view.limit,
        "expired": view.expired,
        "classes": [
            {
                "job_class": c.job_class,
                "queued": c.queued,
                "running": c.running,
                "expired": c.expired,
                "succeeded": c.succeeded,
                "failed": c.failed,
                "oldest_queued_age_s": _seconds(c.oldest_queued_age_s),
                "running_jobs": [
                    {
                        "job_id": str(j.job_id),
                        "owner_id": j.owner_id,
                        "fencing_token": j.fencing_token,
                        "attempt": j.attempt,
                        "lease_remaining_s": _seconds(j.lease_remaining_s),
                        "heartbeat_age_s": _seconds(j.heartbeat_age_s),
                        "expired": j.expired,
                        "tool_class": j.tool_class,
                    }
                    for j in c.running_jobs
                ],
                "running_omitted": c.running_omitted,
            }
            for c in view.classes
        ],
    }


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_HEADER: Final = ("JOB", "OWNER", "TOKEN", "ATTEMPT", "LEASE_LEFT", "HEARTBEAT_AGE", "TOOL_CLASS")
_RIGHT: Final = frozenset({"TOKEN", "ATTEMPT"})


def inspection_lines(view: Inspection) -> list[str]:
    """The text report: a head line on the database's clock, then per class a summary line and
    its running jobs in aligned columns. The cells are escaped; the caller escapes each line."""
    at = view.observed_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    expired = f"{count(view.expired, 'running lease')} EXPIRED" if view.expired else "none expired"
    lines = [f"lease store at {at} (database clock): {expired}"]
    if not view.classes:
        lines.append("no jobs")
    tables = [[_row(j) for j in c.running_jobs] for c in view.classes]
    widths = [
        max(len(cell) for cell in column)
        for column in zip(_HEADER, *(row for rows in tables for row in rows), strict=True)
    ]
    for c, rows in zip(view.classes, tables, strict=True):
        lines += ["", _summary(c)]
        if rows:
            lines += [_aligned(_HEADER, widths)] + [_aligned(row, widths) for row in rows]
        if c.running_omitted:
            lines.append(
                f"  ({c.running_omitted} more running not shown: --limit {view.limit}, "
                "expired and least lease left first)"
            )
    return lines


def _summary(c: ClassView) -> str:
    oldest = ""
    if c.oldest_queued_age_s is not None:
        oldest = f" (oldest {_duration(c.oldest_queued_age_s)})"
    expired = f" ({c.expired} EXPIRED)" if c.expired else ""
    return (
        f"{c.job_class}: queued {c.queued}{oldest}, running {c.running}{expired}, "
        f"succeeded {c.succeeded}, failed {c.failed}"
    )


def _row(j: RunningJob) -> tuple[str, ...]:
    lease = _duration(j.lease_remaining_s) + (" EXPIRED" if j.expired else "")
    heartbeat = "-" if j.heartbeat_age_s is None else _duration(j.heartbeat_age_s)
    return (
        str(j.job_id),
        printable(j.owner_id),  # escaped before the columns are measured
        str(j.fencing_token),
        str(j.attempt),
        lease,
        heartbeat,
        printable(j.tool_class or "-"),
    )


def _aligned(cells: Sequence[str], widths: Sequence[int]) -> str:
    parts = [
        cell.rjust(width) if name in _RIGHT else cell.ljust(width)
        for name, cell, width in zip(_HEADER, cells, widths, strict=True)
    ]
    return ("  " + "  ".join(parts)).rstrip()


def _duration(seconds: float) -> str:
    """`12.3s`, `4m05s`, `3h07m`, `2d04h`; negative for a lease past its end."""
    sign = "-" if seconds < 0 else ""
    tenths = round(abs(seconds) * 10)
    if tenths < 600:
        return f"{sign}{tenths / 10:.1f}s"
    whole = tenths // 10
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600:02d}h"


# `detector.leases.retention.DEFAULT_JOB_RETENTION`, which a test holds equal: importing it here
# would import psycopg for every command.
DEFAULT_JOB_RETENTION_H: Final = 7 * 24.0


JobId = Annotated[UUID, Form("a job id (a UUID)", "JOB")]


def _add_metrics(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--metrics-port",
        type=port,
        default=0,
        metavar="PORT",
        help=f"serve /metrics on this port: {what} (default: 0, off)",
    )
    p.add_argument(
        "--metrics-address",
        type=argument_type(IpAddress),
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address /metrics listens on; 0.0.0.0 (or ::) for a scraper on another host "
        "(default: 127.0.0.1)",
    )


def _add_without_relay(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--without-relay",
        action="store_true",
        help="no relay publishes the outbox (no Kafka yet): prune outbox rows and finished jobs "
        "by age alone, relayed or not",
    )


def _add_dsn(p: argparse.ArgumentParser) -> None:
    LeasesSettings.add_flags(p)
    p.add_argument(
        "--dsn",
        dest="leases_dsn",
        default=argparse.SUPPRESS,
        metavar="DSN",
        help=f"the same as {flag('leases_dsn')}",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    leases = subparsers.add_parser(
        "leases", help="the fenced PostgreSQL lease store of the job-queue practice"
    )
    actions = leases.add_subparsers(dest="leases_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "migrate",
        help="create or update the lease store's tables (a second run changes nothing)",
        description="Apply the schema steps the database lacks, in one transaction. Exit 0: "
        "the schema is current (or now is); 2: the DSN or the database cannot be used.",
    )
    _add_dsn(p)
    p.add_argument(
        "--langgraph",
        action="store_true",
        help="only the LangGraph thread ledger's tables (langgraph_threads, langgraph_children "
        "and its function), for a LangGraph app's database: nothing of the job queue",
    )
    p.set_defaults(run=run_migrate)

    p = actions.add_parser(
        "inspect",
        help="who owns each running job, and which running leases expired",
        description="Per job class: the count of each state, the age of the oldest queued "
        "job, and the running jobs (owner, token, attempt, lease left, heartbeat age), expired "
        "leases first. Times are the database's. Exit 0: no running lease expired; 1: at least "
        "one did (its owner may no longer write, and no worker has claimed it again); 2: the "
        "DSN or the database cannot be used (not migrated, unreachable).",
    )
    _add_dsn(p)
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help=f"aligned text for a person (default) or one JSON document ({INSPECT_SCHEMA})",
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=50,
        metavar="N",
        help="running jobs shown per class, expired and least lease left first; the others "
        "are counted (default: 50)",
    )
    p.add_argument(
        "--class",
        dest="job_class",
        metavar="NAME",
        help="only this job class (shown with zero counts if it has no jobs)",
    )
    p.set_defaults(run=run_inspect)

    p = actions.add_parser(
        "relay",
        help="publish the lease store's outbox to the input topic (at least once, with seq)",
        description="Publish every transition recorded in tool_job_outbox to Kafka, keyed by "
        "job, each job's in seq order (also with several relays: a batch locks its jobs), "
        "and mark it relayed once Kafka acknowledged it; relayed rows older than the "
        "retention are deleted. Runs until SIGTERM or SIGINT; an unreachable database or broker "
        "pauses it, and it resumes where it stopped. Exit 0 on a signal; 2: the DSN, the "
        "database or the Kafka settings cannot be used.",
    )
    _add_dsn(p)
    p.add_argument(
        "--topic", default=INPUT_TOPIC, metavar="NAME", help="the topic the outbox is published to"
    )
    p.add_argument(
        "--dlq-topic",
        default=DLQ_TOPIC,
        metavar="NAME",
        help="the topic an outbox row that is no valid event is sent to, with the reason",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        default=500,
        metavar="N",
        help="rows published per transaction (default: 500)",
    )
    p.add_argument(
        "--retention-h",
        type=positive_int,
        default=24,
        metavar="HOURS",
        help="delete relayed rows older than this (default: 24)",
    )
    p.add_argument(
        "--job-retention-h",
        type=positive_int,
        default=int(DEFAULT_JOB_RETENTION_H),
        metavar="HOURS",
        help="delete finished jobs whose events are all relayed, with their outbox rows and "
        "destination receipts, once older than this; it is also the idempotency window "
        f"(default: {DEFAULT_JOB_RETENTION_H:g})",
    )
    _add_metrics(p, "live lease gauges read from the database and the relay's progress")
    add_kafka_arguments(p)
    p.set_defaults(run=run_relay)

    p = actions.add_parser(
        "destination",
        help="serve the example fenced destination over HTTP, for trying it and `probe`",
        description="Serve the example destination (POST /effects/<entity>, the fenced-effect "
        "protocol) on HOST:PORT until SIGTERM or SIGINT, its receipts in the lease store's "
        "database, and print the `splitbrain probe` command that checks it: two running jobs of "
        "its own, at tokens 2 and 1, cancelled when it stops. --unfenced serves a destination "
        "that enforces no fence, as most do, to see what the detector and the probe say about "
        "it. Exit 0 on a signal; 2: the DSN, the database or the port cannot be used.",
    )
    _add_dsn(p)
    p.add_argument("--host", default="127.0.0.1", metavar="HOST", help="(default: 127.0.0.1)")
    p.add_argument(
        "--port", type=port, default=8787, metavar="PORT", help="0: a free one (default: 8787)"
    )
    p.add_argument(
        "--name",
        default="example-destination",
        metavar="NAME",
        help="the destination's name in its receipts and events (default: example-destination)",
    )
    p.add_argument(
        "--unfenced",
        action="store_true",
        help="accept every fence (an effect still once per key and fence)",
    )
    p.set_defaults(run=run_destination)

    p = actions.add_parser(
        "cancel",
        help="stop a queued or running job: its owner is fenced, and the detector told",
        description="Cancel the job as an ordered transition: it takes the next fencing token "
        "(held by --by, under no lease) and ends cancelled, so its running owner's writes are "
        "refused, a fenced destination refuses its fence, and its events (job_claimed by --by, "
        "then lease_released with outcome cancelled) make any later effect of the owner stale "
        "to the detector. Exit 0: cancelled; 1: the job is not queued or running (finished, or "
        "no such job); 2: the DSN or the database cannot be used.",
    )
    _add_dsn(p)
    p.add_argument("job", type=argument_type(JobId), metavar="JOB", help="the job's id (a UUID)")
    p.add_argument(
        "--by",
        default="operator",
        metavar="NAME",
        help="who cancels, recorded as the new token's owner (default: operator)",
    )
    p.set_defaults(run=run_cancel)

    p = actions.add_parser(
        "prune",
        help="delete finished jobs and relayed outbox rows older than a horizon",
        description="Delete the finished jobs (succeeded, failed, cancelled) last changed "
        "before the horizon whose events are all relayed, with their outbox rows and a fenced "
        "destination's receipts, and every outbox row relayed before it. A pruned job's "
        "idempotency key enqueues a new job: the horizon is also the idempotency window. "
        "The relay prunes on its own schedule (--retention-h, --job-retention-h); this is for "
        "a cron, or a store without a relay. Exit 0; 2: the DSN or the database cannot be used.",
    )
    _add_dsn(p)
    p.add_argument(
        "--older-than",
        type=positive_int,
        required=True,
        metavar="HOURS",
        help="the horizon, in hours before the database's now()",
    )
    _add_without_relay(p)
    p.set_defaults(run=run_prune)

    p = actions.add_parser(
        "maintain",
        help="the lease store's upkeep without Kafka: retention and the live gauges on /metrics",
        description="Prune finished jobs and outbox rows older than their horizons and serve "
        "the live lease gauges, for a store used as a job queue before the detector is added "
        "(no Kafka in the environment). With --without-relay nothing relays the outbox, so it "
        "is pruned by age alone; without it, only what a relay published is pruned. Runs "
        "until SIGTERM or SIGINT; a database that does not answer pauses it. Exit 0 on a "
        "signal; 2: the DSN or the database cannot be used.",
    )
    _add_dsn(p)
    p.add_argument(
        "--job-retention-h",
        type=positive_int,
        default=int(DEFAULT_JOB_RETENTION_H),
        metavar="HOURS",
        help="delete finished jobs, with their outbox rows and destination receipts, once older "
        f"than this; it is also the idempotency window (default: {DEFAULT_JOB_RETENTION_H:g})",
    )
    p.add_argument(
        "--outbox-retention-h",
        type=positive_int,
        default=24,
        metavar="HOURS",
        help="delete outbox rows older than this (default: 24)",
    )
    p.add_argument(
        "--prune-every-s",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how often to prune (default: 60)",
    )
    _add_without_relay(p)
    _add_metrics(p, "the live lease gauges read from the database")
    p.set_defaults(run=run_maintain)
