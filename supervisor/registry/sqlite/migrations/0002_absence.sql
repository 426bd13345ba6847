-- The sweeper's absence judgement (ADR 0002 D9), kept on the row so a restart neither repeats nor loses it.
ALTER TABLE jobs ADD COLUMN stalled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN stalled_since TEXT;
ALTER TABLE jobs ADD COLUMN silent INTEGER NOT NULL DEFAULT 0;
