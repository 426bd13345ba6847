-- phase: expand
-- Release 1.1.0 (CHANGELOG.md): each row records the release of the supervisor that enqueued it. A nullable column
-- without a default: a change of the catalog only, no table rewrite (1.0.0 inserts rows without it). Migration 16 (a
-- contract) makes it required once every host runs 1.1.0. As the SQLite registry's migration 17.
ALTER TABLE jobs ADD COLUMN enqueued_release text;
