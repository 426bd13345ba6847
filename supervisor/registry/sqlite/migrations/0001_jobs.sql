-- The job rows. A sweep reads only running rows and a drain only queued ones: O(active rows), not O(history).
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    argv TEXT NOT NULL,
    status TEXT NOT NULL,
    error_reason TEXT,
    exit_code INTEGER,
    created_at TEXT NOT NULL,
    started_at TEXT,
    ended_at TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    boot_id TEXT,
    pid INTEGER,
    pid_start_time INTEGER,
    kernel_boot_id TEXT,
    container_id TEXT,
    token_hash TEXT,
    completed_units INTEGER NOT NULL DEFAULT 0,
    total_units INTEGER,
    stage TEXT,
    last_heartbeat_at TEXT,
    last_progress_at TEXT,
    log_path TEXT,
    coalesce_key TEXT
);
CREATE INDEX jobs_status_seq ON jobs (status, seq);
CREATE INDEX jobs_kind_seq ON jobs (kind, seq);
CREATE INDEX jobs_queued_coalesce ON jobs (coalesce_key) WHERE status = 'queued';
