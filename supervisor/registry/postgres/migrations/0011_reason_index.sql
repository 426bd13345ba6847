-- phase: expand
-- transaction: none
-- The job list's reason filter (newest first) reads an index (as migration 10's). Built CONCURRENTLY: promotions
-- and writes go on while it is built. A build that fails leaves an INVALID index: DROP INDEX CONCURRENTLY
-- jobs_reason_seq, then supervisor migrate again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_reason_seq ON jobs (error_reason, seq) WHERE error_reason IS NOT NULL;
