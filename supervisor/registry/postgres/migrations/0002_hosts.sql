-- A fleet of supervisors on one database (issue 27, ADR 0012): each host's lease, the one leader, and the host that
-- promoted each row (only that host judges its process). As the SQLite registry's migration 6.
CREATE TABLE hosts (
    host_id text PRIMARY KEY,
    boot_id text NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL
);

CREATE TABLE leader (
    one integer PRIMARY KEY CHECK (one = 1),
    host_id text NOT NULL,
    boot_id text NOT NULL,
    since timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL
);

ALTER TABLE jobs ADD COLUMN host_id text;
