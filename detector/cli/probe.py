"""`splitbrain probe URL`: does this destination enforce the fence? The practice's advice
("check whether the destination enforces the fence") as a command.

It speaks the project's fenced-effect protocol (`POST /effects/<entity>` with `X-Execution-Fence`,
`Idempotency-Key`, `X-Execution-Job`, `X-Execution-Worker`; 200 accepted or repeated, 409
rejected: `detector.leases.http_destination`) and sends six requests, on one entity of its own,
for two jobs: `--job`, whose current token is n (`--fence`), and `--second-job`, whose current
token is m < n (`--second-fence`, default n - 1):

1. a write of the job under fence n with a fresh key: the current owner's, which must be accepted;
2. the same key again under n: one effect per key, answered `repeated`;
3. a fresh key of the second job under m, on the same entity: its current owner's, which must be
   accepted (a fence is compared with its own job's token, never with another job's: a
   destination that keeps the highest fence per entity refuses it);
4. a fresh key of the job under n - 1 after n was seen: a displaced owner's new effect, which
   must be refused;
5. the first key again under n - 1: a displaced owner retrying its successor's key, which must be
   refused too, not handed the successor's receipt (it would read as its own success);
6. a fresh key of the job under n + 1: a fence the store never issued for the job, which must be
   refused (a destination that accepts any fence at or above the job's lets a caller that claims
   a higher fence in, and then refuses the real owner).

Every key and the entity start with `--key-prefix` and a run id: it writes nowhere else, and
says so before it writes. Exit 0: every guarantee holds; 1: one does not (the table's last line
names each that fails); 2: it cannot run (unreachable, the first write refused or answered with
an error, a job the destination does not know).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Final
from urllib.parse import quote, urlsplit

from pydantic import Field

from detector.cli.arguments import add_format, argument_type
from detector.errors import ExitCode, SplitbrainError
from detector.report import printable
from detector.settings import Form

PROBE_SCHEMA: Final = "splitbrain.probe/v1"
_TIMEOUT_S: Final = 10.0
_FENCE: Final = "X-Execution-Fence"
_KEY: Final = "Idempotency-Key"
_JOB: Final = "X-Execution-Job"
_WORKER: Final = "X-Execution-Worker"


class _CannotRun(SplitbrainError):  # noqa: N818 - the probe cannot judge: exit 2, the reason
    exit_code = ExitCode.UNUSABLE


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def summary(self) -> str:
        said = self.body.get("status") or self.body.get("error") or "-"
        return f"{self.status} {said}"


@dataclass(frozen=True, slots=True)
class Check:
    guarantee: str
    request: str
    expected: str
    answer: Answer
    holds: bool


class _Client:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _CannotRun(f"{url!r}: expected http://HOST[:PORT][/PATH]")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")

    def post(self, entity: str, headers: dict[str, str]) -> Answer:
        make = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = make(self._host, self._port, timeout=_TIMEOUT_S)
        path = f"{self._base}/effects/{quote(entity, safe='')}"
        body = json.dumps({"probe": True}).encode()
        try:
            conn.request(
                "POST",
                path,
                body,
                {**headers, "Content-Type": "application/json"},
            )
            response = conn.getresponse()
            raw = response.read()
        except OSError as exc:
            raise _CannotRun(f"no answer from {self._host}: {exc}") from None
        finally:
            conn.close()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {}
        return Answer(response.status, parsed if isinstance(parsed, dict) else {})


def probe(
    url: str,
    *,
    job: str,
    worker: str,
    fence: int,
    prefix: str,
    second_job: str,
    second_fence: int,
) -> list[Check]:
    """The six requests and what each answer says; `_CannotRun` when the first is not
    accepted (nothing else can be judged then), or a job is unknown to the destination."""
    if second_job == job:
        raise _CannotRun("--second-job must be another job than --job")
    if not 0 <= second_fence < fence:
        raise _CannotRun(
            f"--second-fence ({second_fence}) must be below --fence ({fence}): the check is "
            "that a second job's lower token is not compared with the first job's"
        )
    client = _Client(url)
    run = uuid.uuid4().hex[:12]
    entity = f"{prefix}{run}"
    first, fresh, other, forged = (f"{prefix}{run}:{k}" for k in ("a", "b", "c", "d"))

    def send(key: str, at: int, of: str = job) -> Answer:
        headers = {_FENCE: str(at), _KEY: key, _JOB: of, _WORKER: worker}
        answer = client.post(entity, headers)
        if answer.status == 404 and answer.body.get("field") == _JOB:
            option = "--job" if of == job else "--second-job"
            raise _CannotRun(
                f"the destination does not know job {of}: pass {option} with one it knows "
                "(`splitbrain leases destination` prints them)"
            )
        return answer

    accepted = send(first, fence)
    if accepted.status != 200 or accepted.body.get("status") != "accepted":
        raise _CannotRun(f"the first write, under fence {fence}, was not accepted: {accepted}")
    again = send(first, fence)
    second = send(other, second_fence, second_job)
    stale = send(fresh, fence - 1)
    stale_repeat = send(first, fence - 1)
    unissued = send(forged, fence + 1)
    return [
        Check("accepts the current fence", f"key a, fence {fence}", "200 accepted", accepted, True),
        Check(
            "one effect per idempotency key",
            f"key a again, fence {fence}",
            "200 repeated",
            again,
            again.status == 200 and again.body.get("repeated") is True,
        ),
        Check(
            "accepts a second job's own lower fence on the entity",
            f"second job, key c, fence {second_fence}",
            "200 accepted",
            second,
            second.status == 200 and second.body.get("status") == "accepted",
        ),
        Check(
            "refuses a lower fence",
            f"key b, fence {fence - 1}",
            "409 rejected",
            stale,
            stale.status == 409,
        ),
        Check(
            "refuses a lower fence under a key already used",
            f"key a, fence {fence - 1}",
            "409 rejected",
            stale_repeat,
            stale_repeat.status == 409,
        ),
        Check(
            "refuses a fence above the job's token (unissued)",
            f"key d, fence {fence + 1}",
            "409 rejected",
            unissued,
            unissued.status == 409,
        ),
    ]


def run_probe(args: argparse.Namespace) -> int:
    prefix: str = args.key_prefix
    print(
        f"probe: writing 6 requests to {printable(args.url)}/effects/ on one entity, every key "
        f"and the entity under the prefix {printable(prefix)!r} (nothing else is written)",
        file=sys.stderr,
        flush=True,
    )
    checks = probe(
        args.url,
        job=args.job,
        worker=args.worker,
        fence=args.fence,
        prefix=prefix,
        second_job=args.second_job,
        second_fence=args.fence - 1 if args.second_fence is None else args.second_fence,
    )
    holds = all(c.holds for c in checks)
    if args.format == "json":
        document = {
            "schema": PROBE_SCHEMA,
            "url": args.url,
            "key_prefix": prefix,
            "fenced": holds,
            "checks": [
                {
                    "guarantee": c.guarantee,
                    "request": c.request,
                    "expected": c.expected,
                    "status": c.answer.status,
                    "answer": c.answer.body.get("status") or c.answer.body.get("error"),
                    "holds": c.holds,
                }
                for c in checks
            ],
        }
        print(json.dumps(document, separators=(",", ":")))
    else:
        rows = [("GUARANTEE", "REQUEST", "EXPECTED", "ANSWER", "HOLDS")] + [
            (
                c.guarantee,
                c.request,
                c.expected,
                printable(c.answer.summary),
                "yes" if c.holds else "NO",
            )
            for c in checks
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        broken = "; ".join(c.guarantee for c in checks if not c.holds)
        print(
            "the destination enforces the fence"
            if holds
            else f"the destination does NOT enforce the fence: fails {broken}"
        )
    return ExitCode.OK if holds else ExitCode.FAILED


# A PostgreSQL bigint, as fencing tokens are stored, less one: the probe also sends N + 1.
MAX_FENCE: Final = 2**63 - 2
Fence = Annotated[
    int, Field(ge=1, le=MAX_FENCE), Form(f"a whole number from 1 to {MAX_FENCE}", "N")
]
SecondFence = Annotated[
    int, Field(ge=0, le=MAX_FENCE), Form(f"a whole number from 0 to {MAX_FENCE}", "M")
]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "probe",
        help="check whether a destination enforces the fence (the fenced-effect protocol)",
        description="Send a destination that speaks the fenced-effect protocol (POST "
        "/effects/<entity>, X-Execution-Fence, Idempotency-Key) a write of --job under its "
        "current fence N, the same key again, a write of --second-job under its own lower "
        "fence M on the same entity (to be accepted), a fresh key under N-1, the first key "
        "under N-1, and a fresh key under N+1, a fence the store never issued (each to be "
        "refused), and report which guarantees it keeps. Writes only under --key-prefix, and "
        "says so first. Exit 0: every guarantee holds; 1: one does not, named; 2: it cannot "
        "run (unreachable, the first write refused, a job unknown).",
    )
    p.add_argument("url", metavar="URL", help="the destination's base URL (http://HOST:PORT)")
    p.add_argument(
        "--job",
        default=str(uuid.UUID(int=0)),
        metavar="JOB",
        help="the job id sent as X-Execution-Job (the example destination needs one it knows: "
        "`splitbrain leases destination` prints it)",
    )
    p.add_argument(
        "--fence",
        type=argument_type(Fence),
        default=2,
        metavar="N",
        help="--job's current token; the probe's stale fence is N-1, its unissued one N+1 "
        "(default: 2)",
    )
    p.add_argument(
        "--second-job",
        default=str(uuid.UUID(int=1)),
        metavar="JOB",
        help="another job, whose current token is --second-fence: its write on the same entity "
        "must be accepted (the example destination needs one it knows)",
    )
    p.add_argument(
        "--second-fence",
        type=argument_type(SecondFence),
        default=None,
        metavar="M",
        help="--second-job's current token, below N (default: N-1)",
    )
    p.add_argument(
        "--key-prefix",
        default="splitbrain-probe:",
        metavar="PREFIX",
        help="the namespace of every key and entity written (default: splitbrain-probe:)",
    )
    p.add_argument(
        "--worker",
        default="splitbrain-probe",
        metavar="ID",
        help="the worker id sent (default: splitbrain-probe)",
    )
    add_format(p, f"a table (default) or one JSON document ({PROBE_SCHEMA})")
    p.set_defaults(run=run_probe)
