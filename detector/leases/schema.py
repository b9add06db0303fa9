"""The lease store's schema, as ordered migration steps recorded in `splitbrain_migrations`.

Each step runs once, in order, in one transaction with the others of its run, under an advisory
lock so that two `migrate` runs never interleave. A step is recorded with the checksum of its SQL:
a database whose recorded step differs from this version's, or that holds a step this version
does not know (a newer version migrated it), is refused rather than guessed at. The SQL lives
here, not in `.sql` files, so that a wheel cannot ship without it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg.rows import DictRow

from detector.leases.errors import MigrationError

# Any constant: it only has to be the same for every run of `migrate`.
_MIGRATION_LOCK: Final = 0x73706C697462


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


_TOOL_JOBS: Final = """
CREATE TABLE tool_jobs (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    job_class       text NOT NULL CHECK (char_length(job_class) BETWEEN 1 AND 128),
    state           text NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    owner_id        text CHECK (char_length(owner_id) BETWEEN 1 AND 256),
    lease_until     timestamptz,
    fencing_token   bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
    heartbeat_at    timestamptz,
    attempt         integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    idempotency_key text NOT NULL UNIQUE CHECK (char_length(idempotency_key) BETWEEN 1 AND 512),
    payload         jsonb NOT NULL,
    result          jsonb,
    error           jsonb,
    tool_class      text CHECK (char_length(tool_class) BETWEEN 1 AND 128),
    model           text CHECK (char_length(model) BETWEEN 1 AND 128),
    provider        text CHECK (char_length(provider) BETWEEN 1 AND 128),
    -- The last seq taken for this job's outbox, in the transaction of each transition.
    event_seq       bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tool_jobs_running_is_leased
        CHECK (state <> 'running' OR (owner_id IS NOT NULL AND lease_until IS NOT NULL))
);
-- What claim scans: the jobs of one class that are, or may become, claimable, oldest first.
CREATE INDEX tool_jobs_claimable ON tool_jobs (job_class, created_at)
    WHERE state IN ('queued', 'running');

-- One ownership event per transition, written in the transition's transaction; the relay
-- publishes the rows whose relayed_at is null, per job in seq order.
CREATE TABLE tool_job_outbox (
    job_id     uuid NOT NULL REFERENCES tool_jobs (id),
    seq        bigint NOT NULL CHECK (seq >= 1),
    event      jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    relayed_at timestamptz,
    PRIMARY KEY (job_id, seq)
);
CREATE INDEX tool_job_outbox_unrelayed ON tool_job_outbox (created_at) WHERE relayed_at IS NULL;
"""

# The fenced destination (detector/leases/destination.py), in the lease store's database so that
# its receipts take their seq in the job's order.
_FENCED_DESTINATION: Final = """
-- Per destination and entity, the highest fence seen: what a lower fence is refused against.
CREATE TABLE fenced_entities (
    destination text NOT NULL CHECK (char_length(destination) BETWEEN 1 AND 256),
    entity      text NOT NULL CHECK (char_length(entity) BETWEEN 1 AND 256),
    fence       bigint NOT NULL CHECK (fence >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (destination, entity)
);

-- One row per decision. An idempotency key has at most one accepted receipt (its one effect);
-- a refusal does not use the key up, so a key can also have refusals, one per fence presented.
CREATE TABLE fenced_receipts (
    destination     text NOT NULL,
    idempotency_key text NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 512),
    fence           bigint NOT NULL CHECK (fence >= 0),
    accepted        boolean NOT NULL,
    entity          text NOT NULL,
    effect_key      text NOT NULL CHECK (char_length(effect_key) BETWEEN 1 AND 512),
    job_id          uuid NOT NULL REFERENCES tool_jobs (id),
    worker_id       text NOT NULL CHECK (char_length(worker_id) BETWEEN 1 AND 256),
    fence_held      bigint NOT NULL CHECK (fence_held >= 0),
    seq             bigint NOT NULL CHECK (seq >= 1),
    result          jsonb,
    fenced          boolean NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (destination, idempotency_key, fence),
    FOREIGN KEY (destination, entity) REFERENCES fenced_entities (destination, entity)
);
-- A fenced destination makes one effect per key; the unfenced mode only one per key and fence.
CREATE UNIQUE INDEX fenced_receipts_one_effect ON fenced_receipts (destination, idempotency_key)
    WHERE accepted AND fenced;

-- The effect of a request that brings a payload rather than its own effect: one row per effect.
CREATE TABLE fenced_effects (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination     text NOT NULL,
    entity          text NOT NULL,
    idempotency_key text NOT NULL,
    fence           bigint NOT NULL,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (destination, idempotency_key, fence)
);
"""

# What the relay's pruning reads (relayed rows by age), and what a claim's reaping reads (jobs of
# a class whose attempts are used up) without scanning every open job of the class: measured, a
# claim took 13.9 ms with 50,000 queued jobs without it, 3.6 ms with it (docs/benchmarks.md).
_INDEXES: Final = """
CREATE INDEX tool_job_outbox_relayed ON tool_job_outbox (relayed_at) WHERE relayed_at IS NOT NULL;
CREATE INDEX tool_jobs_attempts ON tool_jobs (job_class, attempt)
    WHERE state IN ('queued', 'running');
"""

# Retries wait until `not_before` (backoff with jitter); an operator's cancel is a state of its own;
# pruning reads finished jobs by age.
_RETRIES_CANCEL_RETENTION: Final = """
ALTER TABLE tool_jobs ADD COLUMN not_before timestamptz;
ALTER TABLE tool_jobs DROP CONSTRAINT tool_jobs_state_check;
ALTER TABLE tool_jobs ADD CONSTRAINT tool_jobs_state_check
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled'));
CREATE INDEX tool_jobs_finished ON tool_jobs (updated_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
-- What a claim reads: the oldest queued jobs of a class, and its running jobs by lease end
-- (tool_jobs_claimable would pass over every running job whose lease holds).
CREATE INDEX tool_jobs_queued ON tool_jobs (job_class, created_at) WHERE state = 'queued';
CREATE INDEX tool_jobs_leased ON tool_jobs (job_class, lease_until) WHERE state = 'running';
CREATE INDEX fenced_receipts_job ON fenced_receipts (job_id);
"""

# LangGraph threads (detector/adapters/langgraph.py). LangGraph has no owner epoch: a run on a
# thread takes the next one here, as a claim takes the next fencing token, and every checkpoint
# it records takes the thread's next seq under the same row lock. The first child of each parent
# checkpoint is kept under a primary key, so that of two writers on one thread exactly one is
# first and the other learns the thread forked.
_LANGGRAPH: Final = """
CREATE TABLE langgraph_threads (
    thread_id     text NOT NULL,
    checkpoint_ns text NOT NULL,
    epoch         bigint NOT NULL CHECK (epoch >= 0),
    seq           bigint NOT NULL CHECK (seq >= 1),
    PRIMARY KEY (thread_id, checkpoint_ns)
);
CREATE TABLE langgraph_children (
    thread_id     text NOT NULL,
    checkpoint_ns text NOT NULL,
    parent_id     text NOT NULL,  -- '' for a thread's first checkpoint
    child_id      text NOT NULL,
    epoch         bigint NOT NULL CHECK (epoch >= 0),
    worker_id     text NOT NULL,
    seq           bigint NOT NULL CHECK (seq >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, checkpoint_ns, parent_id)
);
"""

# A batch of LangGraph ledger steps in one round trip (detector/adapters/langgraph.py): the
# statements of migration 5, looped in order over a JSON array (one parameter: the cheapest for
# the client to send), in one transaction. Each step keeps its thread's row locked until the end,
# so the fork check stays as atomic as one statement's; the batch first takes an advisory lock
# per thread in one global order, so that two batches touching the same threads in different
# orders wait for each other rather than deadlock. A step, [thread, namespace, begins, parent,
# child, worker, epoch, run], begins a run (the thread's next epoch and a seq for the
# acquisition), records a child (under `epoch`, else the epoch begun by step `run`, from 0, of
# this batch, else its own), or, with neither, takes the thread's next seq (a release).
_LANGGRAPH_BATCH: Final = """
CREATE FUNCTION splitbrain_langgraph_steps(steps jsonb) RETURNS TABLE (
    step integer, begun_epoch bigint, begun_seq bigint, seq bigint,
    first_child text, first_epoch bigint, first_worker text, first_seq bigint
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    lock_key integer;
    s jsonb;
    begun bigint[] := '{}';
BEGIN
    FOR lock_key IN
        SELECT DISTINCT hashtext((e ->> 0) || chr(1) || (e ->> 1))
          FROM jsonb_array_elements(steps) AS e
         ORDER BY 1
    LOOP  -- 0x4C47: this ledger's space of two-key advisory locks (the relays' is 0x5B1A)
        PERFORM pg_advisory_xact_lock(19527, lock_key);
    END LOOP;
    FOR i IN 1 .. jsonb_array_length(steps) LOOP
        s := steps -> (i - 1);
        step := i - 1;
        begun_epoch := NULL; begun_seq := NULL; seq := NULL;
        first_child := NULL; first_epoch := NULL; first_worker := NULL; first_seq := NULL;
        IF (s ->> 2)::boolean THEN
            INSERT INTO langgraph_threads AS t (thread_id, checkpoint_ns, epoch, seq)
            VALUES (s ->> 0, s ->> 1, 1, 1)
            ON CONFLICT (thread_id, checkpoint_ns)
                DO UPDATE SET epoch = t.epoch + 1, seq = t.seq + 1
            RETURNING t.epoch, t.seq INTO begun_epoch, begun_seq;
            begun[i] := begun_epoch;
        END IF;
        IF s ->> 4 IS NOT NULL OR NOT (s ->> 2)::boolean THEN
            INSERT INTO langgraph_threads AS t (thread_id, checkpoint_ns, epoch, seq)
            VALUES (s ->> 0, s ->> 1, 0, 1)
            ON CONFLICT (thread_id, checkpoint_ns) DO UPDATE SET seq = t.seq + 1
            RETURNING t.seq INTO seq;
        END IF;
        IF s ->> 4 IS NOT NULL THEN
            -- DO UPDATE, not DO NOTHING: it returns the row another transaction committed
            -- after this statement's snapshot, so the second writer always learns who was first.
            INSERT INTO langgraph_children AS c
                   (thread_id, checkpoint_ns, parent_id, child_id, epoch, worker_id, seq)
            VALUES (s ->> 0, s ->> 1, s ->> 3, s ->> 4,
                    coalesce((s ->> 6)::bigint, begun[coalesce((s ->> 7)::integer + 1, i)]),
                    s ->> 5, seq)
            ON CONFLICT (thread_id, checkpoint_ns, parent_id) DO UPDATE SET child_id = c.child_id
            RETURNING c.child_id, c.epoch, c.worker_id, c.seq
            INTO first_child, first_epoch, first_worker, first_seq;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
"""

# What teams moving from other job queues expect of a job, and lease health by tool, model and
# provider. A job's priority comes before its age in the claim (0 first); `gauge_labels` holds the
# labels its class declares (`JobClass.labels`), what the live gauges split the class by.
_PRIORITY_GAUGE_LABELS: Final = """
ALTER TABLE tool_jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE tool_jobs ADD COLUMN gauge_labels jsonb NOT NULL DEFAULT '{}';
DROP INDEX tool_jobs_queued;
CREATE INDEX tool_jobs_queued ON tool_jobs (job_class, priority, created_at)
    WHERE state = 'queued';
"""

MIGRATIONS: Final = (
    Migration(1, "tool_jobs and tool_job_outbox", _TOOL_JOBS),
    Migration(2, "fenced destination", _FENCED_DESTINATION),
    Migration(3, "indexes for relay pruning and claim reaping", _INDEXES),
    Migration(4, "retry backoff, cancel and retention", _RETRIES_CANCEL_RETENTION),
    Migration(5, "langgraph threads: epochs, seq and first children", _LANGGRAPH),
    Migration(6, "langgraph ledger steps in batches", _LANGGRAPH_BATCH),
    Migration(7, "job priorities and gauge labels", _PRIORITY_GAUGE_LABELS),
)

# What the LangGraph thread ledger needs (detector/adapters/langgraph.py): its own tables and
# function, none of the job queue's, so that a LangGraph app's database gets nothing else.
LANGGRAPH: Final = frozenset({5, 6})


@dataclass(frozen=True, slots=True)
class MigrationRun:
    """What one `migrate` did: the steps it applied (none when the schema was current)."""

    applied: tuple[Migration, ...]
    version: int


def migrate(conn: psycopg.Connection[DictRow], only: Collection[int] | None = None) -> MigrationRun:
    """Apply the steps the database lacks (of those in `only`, when given), in one transaction; a
    second run applies none."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS splitbrain_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        recorded = conn.execute(
            "SELECT version, name, checksum FROM splitbrain_migrations ORDER BY version"
        ).fetchall()
        known = {m.version: m for m in MIGRATIONS}
        for row in recorded:
            step = known.get(row["version"])
            if step is None:
                raise MigrationError(
                    f"the database has migration {row['version']} ({row['name']}), which this "
                    f"version does not know: a newer splitbrain migrated it"
                )
            if step.checksum != row["checksum"]:
                raise MigrationError(
                    f"migration {step.version} ({step.name}) was applied from different SQL "
                    f"(checksum {row['checksum'][:12]}, this version's {step.checksum[:12]})"
                )
        done = {row["version"] for row in recorded}
        wanted = [m for m in MIGRATIONS if only is None or m.version in only]
        pending = tuple(m for m in wanted if m.version not in done)
        for step in pending:
            conn.execute(step.sql)
            conn.execute(
                "INSERT INTO splitbrain_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (step.version, step.name, step.checksum),
            )
    return MigrationRun(applied=pending, version=max(m.version for m in wanted))
