-- Every SQL statement the control plane runs, by name. `controlplane.queries` loads this file;
-- a block starts with "-- name: <name>" and its remaining comment lines say what it is for.

-- name: append_events
-- Append events to one stream, only if the stream is at the expected version and its head was
-- written by an older transaction (so (xid, position) order never inverts a stream's versions).
-- Zero rows back means a conflict. With $7 it also wakes listeners when the caller's
-- transaction commits: one pg_notify per statement, and Postgres folds identical
-- notifications within a transaction, so a transaction sends one at most.
WITH head AS (
    SELECT stream_version, xid FROM events
    WHERE stream_id = $1
    ORDER BY stream_version DESC
    LIMIT 1
), inserted AS (
    INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)
    SELECT $1, $2 + e.ord, e.type, e.schema_version, e.data, $6
    FROM unnest($3::text[], $4::smallint[], $5::jsonb[])
        WITH ORDINALITY AS e(type, schema_version, data, ord)
    WHERE coalesce((SELECT stream_version FROM head), 0) = $2
      AND coalesce((SELECT xid FROM head), '0'::xid8) <= pg_current_xact_id()
    RETURNING position, xid, recorded_at
)
SELECT array_agg(position ORDER BY position) AS positions,
       max(xid)::text::bigint AS xid,
       min(recorded_at) AS recorded_at,
       CASE WHEN $7 AND count(*) > 0 THEN pg_notify('trainyard_events', '') END AS notified
FROM inserted;

-- name: notify_events
-- Wake every listener after appends that committed on their own; the payload means nothing.
SELECT pg_notify('trainyard_events', '');

-- name: stream_head
-- The version of a stream and whether its head was written by a younger transaction than the
-- caller's; used only to explain a refused append.
SELECT stream_version, xid > pg_current_xact_id() AS younger
FROM events
WHERE stream_id = $1
ORDER BY stream_version DESC
LIMIT 1;

-- name: read_stream
SELECT position, xid::text::bigint AS xid, stream_id, stream_version, type, schema_version,
       data, metadata, recorded_at
FROM events
WHERE stream_id = $1 AND stream_version >= $2
ORDER BY stream_version;

-- name: read_log
-- The global log after a checkpoint, in (xid, position) order, only below the oldest running
-- transaction: everything under that bound has committed or rolled back, so no later commit
-- can ever land before the returned events, and a reader never skips or repeats one.
SELECT position, xid::text::bigint AS xid, stream_id, stream_version, type, schema_version,
       data, metadata, recorded_at
FROM events
WHERE (xid, position) > ($1::text::xid8, $2::bigint)
  AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, position
LIMIT $3;

-- name: log_has_more
-- Whether a reader at this checkpoint has events to read now.
SELECT EXISTS (
    SELECT 1 FROM events
    WHERE (xid, position) > ($1::text::xid8, $2::bigint)
      AND xid < pg_snapshot_xmin(pg_current_snapshot())
);

-- name: lock_projection
-- Only one runner (across control plane replicas) applies a projection at a time; the lock
-- ends with the transaction, so a dead replica never holds it.
SELECT pg_try_advisory_xact_lock(hashtextextended('trainyard.projection:' || $1, 0));

-- name: lock_projection_wait
-- The same lock, waited for: a rebuild lets a running batch finish rather than skip.
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.projection:' || $1, 0));

-- name: read_checkpoint
SELECT xid::text::bigint AS xid, position FROM projection_checkpoints WHERE name = $1;

-- name: write_checkpoint
INSERT INTO projection_checkpoints (name, xid, position, updated_at)
VALUES ($1, $2::text::xid8, $3, now())
ON CONFLICT (name) DO UPDATE
SET xid = excluded.xid, position = excluded.position, updated_at = excluded.updated_at;

-- name: upsert_stream
-- The `streams` read model: one row per stream.
INSERT INTO streams AS s (stream_id, category, version, last_type, first_position,
                          last_position, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $5, $6, $6)
ON CONFLICT (stream_id) DO UPDATE
SET version = excluded.version, last_type = excluded.last_type,
    last_position = excluded.last_position, updated_at = excluded.updated_at;

-- name: ping
SELECT 1;

-- name: database_exists
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1);

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

-- name: log_tail
-- The last event a reader could read now: where a live follower starts.
SELECT xid::text::bigint AS xid, position FROM events
WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid DESC, position DESC
LIMIT 1;

-- name: job_doc
-- The `jobs` projection's folded state of one job, to apply the next event to.
SELECT doc FROM job_status WHERE job_id = $1;

-- name: upsert_job_status
INSERT INTO job_status (job_id, tenant, name, state, attempt, restarts, priority, labels,
                        submitted_at, updated_at, version, doc)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (job_id) DO UPDATE
SET state = excluded.state, attempt = excluded.attempt, restarts = excluded.restarts,
    updated_at = excluded.updated_at, version = excluded.version, doc = excluded.doc;

-- name: insert_job_history
INSERT INTO job_history (job_id, version, position, event, state, attempt, at, actor, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: list_jobs
-- Newest first, optionally one tenant's, filtered by states and labels, after a cursor.
SELECT doc, submitted_at, job_id FROM job_status
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text[] IS NULL OR state = ANY($2::text[]))
  AND labels @> $3::jsonb
  AND ($4::timestamptz IS NULL OR (submitted_at, job_id) < ($4::timestamptz, $5::uuid))
ORDER BY submitted_at DESC, job_id DESC
LIMIT $6;

-- name: insert_tenant
-- The `tenants` projection: one row per tenant.
INSERT INTO tenants (name, weight, gpu_quota, created_at) VALUES ($1, $2, $3, $4);

-- name: insert_api_token
-- The `tenants` projection: a token by the sha256 of its text (the text is never stored).
INSERT INTO api_tokens (token_sha256, token_id, tenant, is_admin, issued_at)
VALUES ($1, $2, $3, $4, $5);

-- name: revoke_api_token
UPDATE api_tokens SET revoked_at = $2 WHERE token_id = $1 AND revoked_at IS NULL;

-- name: authenticate_token
-- Who holds a live token, by the token's sha256; a revoked token authenticates no one.
SELECT tenant, is_admin FROM api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL;

-- name: list_tenants
-- Every tenant with the ids of its live tokens, oldest first.
SELECT t.name, t.weight, t.gpu_quota, t.created_at,
       coalesce(array_agg(k.token_id ORDER BY k.issued_at, k.token_id)
                FILTER (WHERE k.token_id IS NOT NULL), '{}') AS active_tokens
FROM tenants t
LEFT JOIN api_tokens k ON k.tenant = t.name AND k.revoked_at IS NULL
GROUP BY t.name
ORDER BY t.name;

-- name: tenant_exists
SELECT EXISTS (SELECT 1 FROM tenants WHERE name = $1);
