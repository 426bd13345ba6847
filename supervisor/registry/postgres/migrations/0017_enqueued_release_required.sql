-- phase: contract
-- Release 1.1.0's contract (docs/fleet.md § Upgrading a fleet): every row names the release that enqueued it. Rows
-- from before 1.1.0 are marked 'before-1.1.0'; then NOT NULL (a scan of the table under its lock, no rewrite), so
-- 1.0.0 (which inserts none) cannot run on this schema: supervisor migrate applies this only once no host of 1.0.0
-- is live. As the SQLite registry's migration 18.
UPDATE jobs SET enqueued_release = 'before-1.1.0' WHERE enqueued_release IS NULL;
ALTER TABLE jobs ALTER COLUMN enqueued_release SET NOT NULL;
