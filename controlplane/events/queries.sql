-- The event store's statements: appends, reads of streams and of the global log.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: append_events
-- Append events to several streams in one statement (a claim's jobs; appends gathered by a group
-- commit): stream $1[k] gets the events whose $4 is k, in order, only if it is at version $2[k]
-- and its head was written by an older transaction (so (xid, position) order never inverts a
-- stream's versions). A stream missing from the result was refused: a conflict, and nothing of
-- it was written. Positions are taken in the order rows are inserted, stream by stream and
-- event by event. Listeners are woken when the transaction commits: Postgres folds the
-- identical notifications of a transaction into one. (The notification queue's lock is then
-- held through the commit's WAL flush; group commit keeps such commits few, and measured
-- faster than a NOTIFY of its own after each commit, a statement more each time.)
WITH streams AS (
    SELECT s.stream_id, s.expected, s.metadata, s.k
    FROM unnest($1::text[], $2::bigint[], $3::jsonb[])
        WITH ORDINALITY AS s(stream_id, expected, metadata, k)
    WHERE (SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = s.stream_id)
          = s.expected
      AND coalesce((SELECT xid FROM events
                    WHERE stream_id = s.stream_id AND stream_version = s.expected), '0'::xid8)
          <= pg_current_xact_id()
), inserted AS (
    -- Each event takes its stream's values by subscript, and is kept when its stream passed:
    -- a join of the two unnests would be planned as a nested loop (the planner guesses 100
    -- rows for each), quadratic in the streams of a large append.
    INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)
    SELECT ($1::text[])[e.k], ($2::bigint[])[e.k] + e.ord, e.type, e.schema_version, e.data,
           ($3::jsonb[])[e.k]
    FROM unnest($4::int[], $5::int[], $6::text[], $7::smallint[], $8::jsonb[])
        AS e(k, ord, type, schema_version, data)
    WHERE e.k IN (SELECT k FROM streams)
    ORDER BY e.k, e.ord
    RETURNING stream_id, position, xid, recorded_at
)
SELECT stream_id,
       array_agg(position ORDER BY position) AS positions,
       max(xid)::text::bigint AS xid,
       min(recorded_at) AS recorded_at,
       pg_notify('trainyard_events', '') AS notified
FROM inserted
GROUP BY stream_id;

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
ORDER BY stream_version
LIMIT $3;  -- NULL: all of it (a page of a long stream's history otherwise)

-- name: read_log
-- The global log after a checkpoint, in (xid, position) order, up to the oldest running
-- transaction: everything under that bound has committed or rolled back, so no later commit
-- can ever land before the events a reader takes, and it never skips or repeats one. Committed
-- events past the bound come back too, `held` and without data, after all the others (the
-- order is by xid): a reader takes none of them, but knows that news is waiting for a
-- transaction that may append nothing and so wake no one when it ends (a lease's renewal, a
-- log write), and looks again soon instead of at its next notification (a claim waited up to
-- the poll interval so). With categories $4, the events of other streams come back as their
-- place only (no data, no metadata): a reader moves past them without Postgres rendering
-- their JSON.
SELECT position, xid::text::bigint AS xid, stream_id, stream_version, type, schema_version,
       w.wanted, h.held,
       CASE WHEN w.wanted AND NOT h.held THEN data END AS data,
       CASE WHEN w.wanted AND NOT h.held THEN metadata END AS metadata,
       recorded_at
FROM events,
     LATERAL (SELECT $4::text[] IS NULL OR split_part(stream_id, '-', 1) = ANY($4::text[]))
         AS w(wanted),
     LATERAL (SELECT xid >= pg_snapshot_xmin(pg_current_snapshot())) AS h(held)
WHERE (xid, position) > ($1::text::xid8, $2::bigint)
-- The table's columns, not the output's bigint `xid`: ordered by the cast, Postgres sorted
-- every event after the checkpoint to return the first few, instead of walking the index.
ORDER BY events.xid, events.position
LIMIT $3;

-- name: log_tail
-- The last event a reader could read now: where a live follower starts.
SELECT xid::text::bigint AS xid, position FROM events
WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY events.xid DESC, events.position DESC  -- the index's order (see `read_log`)
LIMIT 1;

-- name: stream_version
SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1;
