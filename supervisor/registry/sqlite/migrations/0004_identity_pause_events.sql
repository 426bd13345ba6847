-- The registry behind an interface (ADR 0007).
--
-- 1. A job's process identity is one record that its executor owns (``{"kind": ..., "fields": {...}}``), not four
--    columns that name every executor's fields. Rows written before keep what they recorded.
ALTER TABLE jobs ADD COLUMN identity TEXT;
UPDATE jobs SET identity = json_object(
        'kind', 'process',
        'fields', json_object('pid', pid, 'pid_start_time', pid_start_time, 'kernel_boot_id', kernel_boot_id))
    WHERE pid IS NOT NULL;
UPDATE jobs SET identity = json_object('kind', 'container', 'fields', json_object('container_id', container_id))
    WHERE pid IS NULL AND container_id IS NOT NULL;
ALTER TABLE jobs DROP COLUMN pid;
ALTER TABLE jobs DROP COLUMN pid_start_time;
ALTER TABLE jobs DROP COLUMN kernel_boot_id;
ALTER TABLE jobs DROP COLUMN container_id;

-- 2. The pause is registry state (the .viewer/jobs.paused file is an operator's switch the sweeper mirrors here).
CREATE TABLE queue_state (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    paused INTEGER NOT NULL DEFAULT 0,
    paused_by TEXT,
    paused_at TEXT
);
INSERT INTO queue_state (singleton, paused) VALUES (1, 0);

-- 3. An event is stored as its fields (the public row as of the change among them); the webhook sender renders the
--    body a receiver gets. Events written before keep theirs, taken apart.
ALTER TABLE outbox ADD COLUMN previous_status TEXT;
ALTER TABLE outbox ADD COLUMN reason TEXT;
ALTER TABLE outbox ADD COLUMN boot_id TEXT;
ALTER TABLE outbox ADD COLUMN job TEXT NOT NULL DEFAULT '{}';
UPDATE outbox SET
    previous_status = json_extract(body, '$.previous_status'),
    reason = json_extract(body, '$.reason'),
    boot_id = json_extract(body, '$.boot_id'),
    job = json_extract(body, '$.job');
ALTER TABLE outbox DROP COLUMN body;
