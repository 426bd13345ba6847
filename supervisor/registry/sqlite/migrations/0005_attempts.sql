-- Crash-only recovery (issue 25): how many starts a job may have (its kind's max_attempts when it was enqueued),
-- when a resubmitted job may run again, and each earlier attempt it was resubmitted after (a JSON list).
ALTER TABLE jobs ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN not_before TEXT;
ALTER TABLE jobs ADD COLUMN history TEXT NOT NULL DEFAULT '[]';
