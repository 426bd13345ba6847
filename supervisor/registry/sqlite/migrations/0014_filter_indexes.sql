-- Every filter of the job list answers from an index, a value that matches nothing included (docs/performance.md
-- § Registry hot paths; docs/api.md § Routes, the listing). New tables, indexes and triggers only.
--
-- A param's value, one row per top-level scalar member of a job's params, kept by the triggers in the transaction
-- that writes the job: `value` has no type affinity, so a number stays a number and compares as one (2 = 2.0,
-- 1e-05 = 0.00001) and a string only as itself; a bool is 1 or 0 (as json_each gives it). The key (name, value,
-- seq) answers "the rows with this value, newest first" without reading jobs; the seq index serves a prune.
CREATE TABLE job_params (
    name TEXT NOT NULL,
    value NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (name, value, seq)
) WITHOUT ROWID;
CREATE INDEX job_params_seq ON job_params (seq);
CREATE TRIGGER job_params_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO job_params (name, value, seq)
    SELECT key, value, new.seq FROM json_each(new.params) WHERE type IN ('integer', 'real', 'text', 'true', 'false');
END;
CREATE TRIGGER job_params_update AFTER UPDATE OF params ON jobs BEGIN
    DELETE FROM job_params WHERE seq = old.seq;
    INSERT INTO job_params (name, value, seq)
    SELECT key, value, new.seq FROM json_each(new.params) WHERE type IN ('integer', 'real', 'text', 'true', 'false');
END;
CREATE TRIGGER job_params_delete AFTER DELETE ON jobs BEGIN
    DELETE FROM job_params WHERE seq = old.seq;
END;
INSERT INTO job_params (name, value, seq)
SELECT p.key, p.value, jobs.seq FROM jobs, json_each(jobs.params) AS p
WHERE p.type IN ('integer', 'real', 'text', 'true', 'false');
-- The reason, the host and the creation time, each with the list's order (seq) where an equality comes first.
CREATE INDEX jobs_reason_seq ON jobs (error_reason, seq) WHERE error_reason IS NOT NULL;
CREATE INDEX jobs_created ON jobs (created_at);
-- The host filter's index (host_id, seq) is migration 17's jobs_host, release 1.1.0's expand.
