-- Settings the whole fleet must share (issue 27, ADR 0012): the first value recorded wins; a supervisor that
-- starts alone records its own. Today: max_concurrent, the fleet-wide limit.
CREATE TABLE fleet_settings (
    name text PRIMARY KEY,
    value text NOT NULL,
    host_id text NOT NULL,
    recorded_at TEXT NOT NULL
);
