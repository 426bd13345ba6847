-- phase: expand
-- transaction: none
-- Every filter of the job list answers from an index, a value that matches nothing included (docs/performance.md
-- § Registry hot paths; docs/api.md § Routes, the listing). This one, a param's value: containment
-- (params::jsonb @> '{"ratio": 1e-05}') through a GIN index of the params as jsonb, which compares a number as a
-- number whatever its spelling. Built CONCURRENTLY, outside a transaction (one statement per such file), so
-- promotions and writes go on while it is built on a large history (ADR 0021). A build that fails leaves an INVALID
-- index: DROP INDEX CONCURRENTLY jobs_params, then supervisor migrate again. The host filter's index is migration 14's
-- jobs_host; the reason's is 11, the creation time's 16.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_params ON jobs USING gin ((params::jsonb) jsonb_path_ops);
