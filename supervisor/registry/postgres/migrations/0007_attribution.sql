-- Who did what (issue 41, ADR 0017): the name of the API token that enqueued a job (``operator`` for the operator
-- token, ``anonymous`` on a server without tokens, ``supervisor`` for a kind's follow-up), and of the one that asked
-- for its cancel. NULL on rows made before this migration.
ALTER TABLE jobs ADD COLUMN enqueued_by text;
ALTER TABLE jobs ADD COLUMN cancelled_by text;
