-- phase: expand
-- Release 1.1.0 (CHANGELOG.md): each row records the release of the supervisor that enqueued it; the job list's
-- host filter (newest first) and a promotion's look for the oldest queued row read indexes of their own. Adds only:
-- a nullable column (1.0.0 inserts rows without it) and two indexes. Migration 18 (a contract) makes the column
-- required once every host runs 1.1.0. As the PostgreSQL registry's migrations 13, 14 and 15.
ALTER TABLE jobs ADD COLUMN enqueued_release TEXT;
CREATE INDEX jobs_host ON jobs (host_id, seq) WHERE host_id IS NOT NULL;
CREATE INDEX jobs_queued_seq ON jobs (seq) WHERE status = 'queued';
