-- A fleet of supervisors on one registry (issue 27, ADR 0012): each host's lease, the one leader, and the host that
-- promoted each row (only that host judges its process).
CREATE TABLE hosts (
    host_id TEXT PRIMARY KEY,
    boot_id TEXT NOT NULL,
    started_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    lease_expires_at TEXT NOT NULL
);

CREATE TABLE leader (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    host_id TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    since TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    lease_expires_at TEXT NOT NULL
);

ALTER TABLE jobs ADD COLUMN host_id TEXT;
