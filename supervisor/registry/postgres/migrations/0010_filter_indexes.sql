-- Every filter of the job list answers from an index, a value that matches nothing included (docs/performance.md
-- § Registry hot paths; docs/api.md § Routes, the listing). Indexes only.
--
-- A param's value: containment (params::jsonb @> '{"ratio": 1e-05}') through a GIN index of the params as jsonb,
-- which compares a number as a number whatever its spelling. Built in the migration's transaction (the migrations
-- run each in one), so not CONCURRENTLY: on a large history the jobs table is held for writes while it builds.
CREATE INDEX jobs_params ON jobs USING gin ((params::jsonb) jsonb_path_ops);
-- The reason, the host and the creation time, each with the list's order (seq) where an equality comes first.
CREATE INDEX jobs_reason_seq ON jobs (error_reason, seq) WHERE error_reason IS NOT NULL;
CREATE INDEX jobs_host_seq ON jobs (host_id, seq) WHERE host_id IS NOT NULL;
CREATE INDEX jobs_created ON jobs (created_at);
