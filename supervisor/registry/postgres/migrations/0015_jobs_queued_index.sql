-- phase: expand
-- transaction: none
-- Release 1.1.0: the queue's rows in their order, alone. A promotion takes the oldest queued row; on a long history
-- PostgreSQL's planner walked the primary key from the oldest row, past every finished one, to a deep queue at the
-- end (half a second a promotion at 1,000,000 rows; bench/migration.py); this index holds only the queued rows.
-- Built CONCURRENTLY, as migration 14. As the SQLite registry's migration 17.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_queued_seq ON jobs (seq) WHERE status = 'queued';
