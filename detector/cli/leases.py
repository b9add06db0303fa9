"""`splitbrain leases`: the fenced PostgreSQL lease store of the job-queue practice.

`migrate` creates or updates its tables. The database is named by `--dsn` (also `--leases-dsn`)
or `SPLITBRAIN_LEASES_DSN`, a libpq connection string. A password never goes into a DSN given
on the command line, which `ps` and shell history keep: libpq reads it from PGPASSWORD or
~/.pgpass, or the whole DSN can come from the variable.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, Field

from detector.errors import ExitCode
from detector.settings import CommandSettings, Form, SettingsError, env_var, flag

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


Command = Callable[[argparse.Namespace], int]


def _reports_errors(command: str) -> Callable[[Command], Command]:
    """A setting that cannot be used, or a database that cannot be (unreachable, refusing the
    statements), is one line per problem and exit 2, not a traceback."""

    def decorate(run: Command) -> Command:
        @functools.wraps(run)
        def wrapped(args: argparse.Namespace) -> int:
            import psycopg  # noqa: PLC0415

            from detector.leases.db import one_line  # noqa: PLC0415
            from detector.leases.errors import LeaseError  # noqa: PLC0415

            try:
                return run(args)
            except (SettingsError, LeaseError) as exc:
                lines = str(exc).splitlines()
            except psycopg.Error as exc:
                lines = [one_line(exc)]
            for line in lines:
                print(f"splitbrain leases {command}: {line}", file=sys.stderr)
            return ExitCode.UNUSABLE

        return wrapped

    return decorate


@_reports_errors("migrate")
def run_migrate(args: argparse.Namespace) -> int:
    from detector.leases.db import connect  # noqa: PLC0415
    from detector.leases.schema import migrate  # noqa: PLC0415

    dsn = LeasesSettings.from_args(args).dsn(args)
    with connect(dsn) as conn:
        run = migrate(conn)
    for step in run.applied:
        print(f"applied migration {step.version}: {step.name}")
    print(
        f"schema at version {run.version}"
        + ("" if run.applied else ": already current, nothing changed")
    )
    return ExitCode.OK


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
    LeasesSettings.add_flags(p)
    p.add_argument(
        "--dsn",
        dest="leases_dsn",
        default=argparse.SUPPRESS,
        metavar="DSN",
        help=f"the same as {flag('leases_dsn')}",
    )
    p.set_defaults(run=run_migrate)
