-- Idempotency keys (issue 35, ADR 0016): one row per job a keyed enqueue answered, in the transaction that made it.
-- The primary key (the key, the job's place in the answer) is the unique constraint that makes a key's request
-- answer once; a retry of the request reads these rows and answers them again. A key expires at expires_at (the
-- sweeper removes it); until then, the jobs it answered are never pruned. The jobs table keeps the key of the request
-- that made each row.
CREATE TABLE idempotency_keys (
    idempotency_key text NOT NULL,
    answer_index integer NOT NULL,
    fingerprint text NOT NULL,
    job_id text NOT NULL,
    status text NOT NULL,
    queue_position integer,
    coalesced boolean NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (idempotency_key, answer_index)
);
CREATE INDEX idempotency_keys_job ON idempotency_keys (job_id);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
ALTER TABLE jobs ADD COLUMN idempotency_key text;
