-- phase: expand
-- Releases and drains (docs/fleet.md § Upgrading a fleet, § Draining a host): each host's lease records the release
-- it runs and the contract level it honours (how many contract migrations it knows), so that a contract migration
-- waits for every host to honour it; a host drained by the operator promotes nothing until undrained (one row per
-- drained host, kept across its restarts). As the PostgreSQL registry's migration 12.
ALTER TABLE hosts ADD COLUMN release_version TEXT;
ALTER TABLE hosts ADD COLUMN contract_level INTEGER;

CREATE TABLE host_drains (
    host_id TEXT PRIMARY KEY,
    drained_at TEXT NOT NULL,
    drained_by TEXT
);
