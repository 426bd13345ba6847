-- A job enqueued by a schedule's tick (issue 57, docs/operations.md "Periodic runs"): the schedule's name and its
-- period. NULL for any other job. The partial index serves "a job of this schedule queued or running" (--if-idle)
-- and "the newest job of each schedule" (the queue's watch of missed runs).
ALTER TABLE jobs ADD COLUMN schedule text;
ALTER TABLE jobs ADD COLUMN schedule_every_s double precision;
CREATE INDEX jobs_schedule ON jobs (schedule, seq) WHERE schedule IS NOT NULL;
