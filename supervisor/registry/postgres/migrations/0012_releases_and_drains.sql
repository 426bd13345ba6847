-- phase: expand
-- Releases and drains (docs/fleet.md § Upgrading a fleet, § Draining a host): each host's lease records the release
-- it runs and the contract level it honours (how many contract migrations it knows), so that a contract migration
-- waits for every host to honour it; a host drained by the operator promotes nothing until undrained (one row per
-- drained host, kept across its restarts). As the SQLite registry's migration 16. Adds only: nullable columns without
-- a default (no table rewrite) and a new table.
ALTER TABLE hosts ADD COLUMN release_version text;
ALTER TABLE hosts ADD COLUMN contract_level integer;

CREATE TABLE host_drains (
    host_id text PRIMARY KEY,
    drained_at timestamptz NOT NULL,
    drained_by text
);
