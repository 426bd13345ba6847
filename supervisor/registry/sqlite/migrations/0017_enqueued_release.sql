-- phase: expand
-- Release 1.1.0 (CHANGELOG.md): each row records the release of the supervisor that enqueued it, and the job list's
-- host filter (newest first) reads an index. Adds only: a nullable column (1.0.0 inserts rows without it) and an
-- index. Migration 18 (a contract) makes the column required once every host runs 1.1.0. As the PostgreSQL
-- registry's migrations 13 and 14.
ALTER TABLE jobs ADD COLUMN enqueued_release TEXT;
CREATE INDEX jobs_host ON jobs (host_id, seq) WHERE host_id IS NOT NULL;
