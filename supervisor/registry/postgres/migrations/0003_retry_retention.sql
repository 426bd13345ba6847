-- An operator's explicit retry of a finished job (issue 28) names the job it retries; the old job's `show` lists its
-- retries through the index. History is pruned by age and count (the sweeper's retention): the terminal rows oldest
-- first by when they ended, and never a job whose events are still in the outbox (looked up by job). As the SQLite
-- registry's migration 7.
ALTER TABLE jobs ADD COLUMN retry_of text;
CREATE INDEX jobs_retry_of ON jobs (retry_of) WHERE retry_of IS NOT NULL;
CREATE INDEX jobs_ended ON jobs (ended_at, seq) WHERE ended_at IS NOT NULL;
CREATE INDEX outbox_job ON outbox (job_id);
