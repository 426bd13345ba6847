-- phase: expand
-- transaction: none
-- The job list's creation-time filters (since, until) read an index (as migration 10's). Built CONCURRENTLY:
-- promotions and writes go on while it is built. A build that fails leaves an INVALID index: DROP INDEX
-- CONCURRENTLY jobs_created, then supervisor migrate again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_created ON jobs (created_at);
