-- phase: contract
-- Release 1.1.0's contract (docs/fleet.md § Upgrading a fleet): every row names the release that enqueued it. Rows
-- from before 1.1.0 are marked 'before-1.1.0'; from here on a row without it is refused, so 1.0.0 (which inserts
-- none) cannot run on this file: supervisor migrate applies this only once no host of 1.0.0 is live. SQLite cannot
-- add NOT NULL to a column in place (a table rebuild): two triggers refuse what NOT NULL would. As the PostgreSQL
-- registry's migration 17.
UPDATE jobs SET enqueued_release = 'before-1.1.0' WHERE enqueued_release IS NULL;
CREATE TRIGGER jobs_enqueued_release_insert BEFORE INSERT ON jobs WHEN NEW.enqueued_release IS NULL
BEGIN
    SELECT RAISE(ABORT, 'NOT NULL constraint failed: jobs.enqueued_release');
END;
CREATE TRIGGER jobs_enqueued_release_update BEFORE UPDATE OF enqueued_release ON jobs
WHEN NEW.enqueued_release IS NULL
BEGIN
    SELECT RAISE(ABORT, 'NOT NULL constraint failed: jobs.enqueued_release');
END;
