-- Boots an operator forgot (issue 27, ADR 0012, INV-FORGET-IS-FENCED): recorded in the forget's own transaction,
-- only once the host's lease had expired; a lease renewal by a forgotten boot is refused. A new boot of the same host
-- id registers as usual. One row per forget: an operator's rare act.
CREATE TABLE forgotten_hosts (
    host_id text NOT NULL,
    boot_id text NOT NULL,
    forgotten_at timestamptz NOT NULL,
    PRIMARY KEY (host_id, boot_id)
);
