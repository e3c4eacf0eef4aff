-- The migrations' own bookkeeping: their lock and the table of those applied.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: migrations_lock
-- Two `trainyard migrate` runs against one database take turns.
SELECT pg_advisory_lock(hashtextextended('trainyard.migrate', 0));

-- name: migrations_unlock
SELECT pg_advisory_unlock(hashtextextended('trainyard.migrate', 0));

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_table_exists
SELECT to_regclass('schema_migrations') IS NOT NULL;

-- name: migrations_applied
SELECT version, name, checksum FROM schema_migrations ORDER BY version;

-- name: migration_record
INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3);
