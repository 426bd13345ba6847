-- The PostgreSQL registry's schema: the SQLite registry's as of its migration 5, in PostgreSQL's types (ADR 0011).
-- Timestamps are timestamptz, always written from the registry's own clock (never now() in SQL); params, argv, the
-- identity record, the history and an event's row are JSON text, read back exactly as written.
--
-- The job rows. A sweep reads only running rows and a drain only queued ones: O(active rows), not O(history).
-- Later columns (a host's id and boot, for the fleet) are added by later migrations, never by editing this one.
CREATE TABLE jobs (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id text NOT NULL UNIQUE,
    kind text NOT NULL,
    params text NOT NULL,
    argv text NOT NULL,
    status text NOT NULL,
    error_reason text,
    exit_code integer,
    created_at timestamptz NOT NULL,
    started_at timestamptz,
    ended_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    boot_id text,
    identity text,
    token_hash text,
    completed_units bigint NOT NULL DEFAULT 0,
    total_units bigint,
    stage text,
    last_heartbeat_at timestamptz,
    last_progress_at timestamptz,
    log_path text,
    coalesce_key text,
    -- The sweeper's absence judgement (ADR 0002 D9), kept on the row so a restart neither repeats nor loses it.
    stalled boolean NOT NULL DEFAULT false,
    stalled_since timestamptz,
    silent boolean NOT NULL DEFAULT false,
    -- Crash-only recovery (issue 25): the starts a job may have, when a resubmitted job may run again, and each
    -- earlier attempt (a JSON list).
    max_attempts integer NOT NULL DEFAULT 1,
    not_before timestamptz,
    history text NOT NULL DEFAULT '[]'
);
CREATE INDEX jobs_status_seq ON jobs (status, seq);
CREATE INDEX jobs_kind_seq ON jobs (kind, seq);
CREATE INDEX jobs_queued_coalesce ON jobs (coalesce_key) WHERE status = 'queued';

-- The pause is registry state: one row.
CREATE TABLE queue_state (
    singleton integer PRIMARY KEY CHECK (singleton = 1),
    paused boolean NOT NULL DEFAULT false,
    paused_by text,
    paused_at timestamptz
);
INSERT INTO queue_state (singleton, paused) VALUES (1, false);

-- The transactional outbox: each event is written in the same transaction as the change it reports, as its fields
-- (the public row as of the change among them), and deleted once delivered.
CREATE TABLE outbox (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    job_id text NOT NULL,
    event text NOT NULL,
    created_at timestamptz NOT NULL,
    previous_status text,
    reason text,
    boot_id text,
    job text NOT NULL DEFAULT '{}'
);
CREATE INDEX outbox_created ON outbox (created_at);
