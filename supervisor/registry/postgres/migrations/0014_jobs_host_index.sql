-- phase: expand
-- transaction: none
-- Release 1.1.0: the job list's host filter (newest first) reads an index. Built CONCURRENTLY, outside a transaction
-- (one statement per such file), so promotions and writes go on while it is built (bench/migration.py measures it on
-- a 1,000,000-row history). A build that fails leaves an INVALID index: DROP INDEX CONCURRENTLY jobs_host, then
-- supervisor migrate again. As the SQLite registry's migration 17.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_host ON jobs (host_id, seq) WHERE host_id IS NOT NULL;
