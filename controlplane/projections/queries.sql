-- Projections' statements: the runner's lock and checkpoints, the `streams` read model.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: lock_projections
-- Only one runner (across control plane replicas) applies a projection at a time; the locks
-- end with the transaction, so a dead replica never holds one. Tried, never waited for (no
-- runner waits on another, so two that lock several never deadlock): the names locked.
-- The transaction commits without waiting for its WAL to reach the disk (set_config, local to
-- it): a crash can lose only the last whole transactions, each batch with its checkpoint, so
-- their events are applied again from the log (an append still waits for the disk). Waiting
-- took 0.7 ms a batch, all the while holding back every reader of the log (`read_log`).
SELECT name
FROM unnest($1::text[]) AS name, set_config('synchronous_commit', 'off', true)
WHERE pg_try_advisory_xact_lock(hashtextextended('trainyard.projection:' || name, 0));

-- name: lock_projection_wait
-- The same lock, waited for: a rebuild lets a running batch finish rather than skip.
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.projection:' || $1, 0));

-- name: read_checkpoints
-- In a statement of its own after `lock_projections`: its snapshot is taken once the locks are
-- held, so it sees the checkpoint a runner that held one just committed.
SELECT name, xid::text::bigint AS xid, position FROM projection_checkpoints
WHERE name = ANY($1::text[]);

-- name: write_checkpoints
-- The projections $1, each moved to the same place (the end of the batch they shared).
INSERT INTO projection_checkpoints (name, xid, position, updated_at)
SELECT name, $2::text::xid8, $3, now() FROM unnest($1::text[]) AS name
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
-- Whether a projection has caught up (`is_caught_up`): the categories of the events readable
-- after its checkpoint, each with its last event's place, and how many events that is (at most
-- $3), read as `read_log` reads (the index's order, below the oldest running transaction) but
-- without data.
SELECT DISTINCT ON (category) category, xid, position, read
FROM (SELECT split_part(stream_id, '-', 1) AS category, xid::text::bigint AS xid, position,
             count(*) OVER () AS read
      FROM (SELECT stream_id, xid, position FROM events
            WHERE (xid, position) > ($1::text::xid8, $2::bigint)
              AND xid < pg_snapshot_xmin(pg_current_snapshot())
            ORDER BY events.xid, events.position
            LIMIT $3) AS after) AS news
ORDER BY category, xid DESC, position DESC;
