-- Projections' statements: the runner's lock and checkpoints, the `streams` read model.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

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

-- name: upsert_streams
-- The `streams` read model: one row per stream; a batch's streams (each once) as arrays: id,
-- category, version, last type, first and last position, first and last recorded time.
INSERT INTO streams AS s (stream_id, category, version, last_type, first_position,
                          last_position, created_at, updated_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::bigint[], $6::bigint[],
                     $7::timestamptz[], $8::timestamptz[])
ON CONFLICT (stream_id) DO UPDATE
SET version = excluded.version, last_type = excluded.last_type,
    last_position = excluded.last_position, updated_at = excluded.updated_at;

-- name: log_news
-- A round's look at the log: the categories of the events readable after the oldest place a
-- runner left its projections, each with its last event's place, and how many events that is
-- (at most $3), read as `read_log` reads (the index's order, below the oldest running
-- transaction) but without data: a projection that none of them concerns sits the round out.
SELECT DISTINCT ON (category) category, xid, position, read
FROM (SELECT split_part(stream_id, '-', 1) AS category, xid::text::bigint AS xid, position,
             count(*) OVER () AS read
      FROM (SELECT stream_id, xid, position FROM events
            WHERE (xid, position) > ($1::text::xid8, $2::bigint)
              AND xid < pg_snapshot_xmin(pg_current_snapshot())
            ORDER BY events.xid, events.position
            LIMIT $3) AS after) AS news
ORDER BY category, xid DESC, position DESC;
