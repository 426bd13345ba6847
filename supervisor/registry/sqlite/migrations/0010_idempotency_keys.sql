-- Idempotency keys (issue 35, ADR 0016): one row per job a keyed enqueue answered, in the transaction that made it.
-- The primary key (the key, the job's place in the answer) is the unique constraint that makes a key's request
-- answer once; a retry of the request reads these rows and answers them again. A key expires at expires_at (the
-- sweeper removes it); until then, the jobs it answered are never pruned. The jobs table keeps the key of the request
-- that made each row.
CREATE TABLE idempotency_keys (
    idempotency_key TEXT NOT NULL,
    answer_index INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    job_id TEXT NOT NULL,
    status TEXT NOT NULL,
    queue_position INTEGER,
    coalesced INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    PRIMARY KEY (idempotency_key, answer_index)
);
CREATE INDEX idempotency_keys_job ON idempotency_keys (job_id);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;
