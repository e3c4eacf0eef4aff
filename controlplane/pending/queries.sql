-- Pending reasons: the recorder's snapshot of the queue and the cluster, its rows, and the
-- `pending` projection's spans. Loaded by `controlplane.queries` with every other .sql file.

-- name: pending_queue
-- Every queued job's current attempt as the claim sees it (the same columns as
-- `claim_candidates`), from the queue's partial index. `allocated`: claimed already, the
-- JobDeploying event not yet applied by the projection.
SELECT s.job_id, s.attempt, s.tenant, s.name, s.learners, s.gpus_per_learner, s.cpus_per_learner,
       s.memory_mb_per_learner, s.learners_per_node, s.priority, s.submitted_at, s.not_before,
       s.inference,
       EXISTS (SELECT 1 FROM allocations a
               WHERE a.job_id = s.job_id AND a.attempt = s.attempt) AS allocated
FROM job_status s
WHERE s.state = 'QUEUED';

-- name: pending_tenants
-- Each tenant's weight, GPU quota and the GPUs its live allocations hold, as the claim weighs
-- them.
SELECT t.name, t.weight, t.gpu_quota, coalesce(u.gpus, 0)::int AS held
FROM tenants t
LEFT JOIN (SELECT tenant, sum(cardinality(gpus)) AS gpus
           FROM allocations WHERE released_at IS NULL
           GROUP BY tenant) u ON u.tenant = t.name
ORDER BY t.name;

-- name: pending_nodes
-- The READY nodes: what each can still give (as `node_capacity` counts it for claims), and
-- what it has in all, healthy GPUs and unhealthy ones apart.
SELECT c.name, c.gpus AS free_gpus, c.cpus AS free_cpus, c.memory_mb AS free_memory_mb,
       n.cpus, n.memory_mb,
       (SELECT count(*) FROM node_gpus g WHERE g.node = n.name AND g.healthy)::int AS healthy,
       (SELECT count(*) FROM node_gpus g WHERE g.node = n.name AND NOT g.healthy)::int
           AS unhealthy
FROM node_capacity c
JOIN nodes n ON n.name = c.name
ORDER BY c.name;

-- name: pending_running
-- The live allocations, learner by learner, with their job's name: the room that comes back
-- when each attempt ends.
SELECT a.tenant, s.name, a.node, a.gpus, a.cpus, a.memory_mb, a.allocated_at
FROM allocations a
JOIN job_status s ON s.job_id = a.job_id
WHERE a.released_at IS NULL;

-- name: pending_durations
-- How long jobs of each tenant and name hold their room, typically: the median of the last 20
-- that COMPLETED within a week (their first learner's allocation, from claim to release).
-- What a queued or running job of that name is expected to take; the recorder reads it now
-- and then, not every round.
SELECT tenant, name, percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) AS seconds
FROM (
    SELECT s.tenant, s.name, extract(epoch FROM a.released_at - a.allocated_at) AS seconds,
           row_number() OVER (PARTITION BY s.tenant, s.name ORDER BY a.released_at DESC) AS k
    FROM allocations a
    JOIN job_status s ON s.job_id = a.job_id AND s.attempt = a.attempt
    WHERE a.learner = 0 AND s.state = 'COMPLETED'
      AND a.released_at > now() - interval '7 days'
) recent
WHERE k <= 20
GROUP BY tenant, name;

-- name: pending_queued_rows
-- The rows of the jobs still queued at the last round.
SELECT job_id, tenant, attempt, version, queued, position, reasons, since, estimated_start,
       updated_at, recorded
FROM pending_reasons
WHERE queued;

-- name: pending_rows_of
-- The rows of jobs $1 (queued now, maybe again after a restart: their rows keep their streams'
-- versions).
SELECT job_id, tenant, attempt, version, queued, position, reasons, since, estimated_start,
       updated_at, recorded
FROM pending_reasons
WHERE job_id = ANY($1::uuid[]);

-- name: pending_round
SELECT writer, round FROM pending_rounds;

-- name: pending_next_round
-- A round that wrote: the rows are as recorder $1 knows them.
INSERT INTO pending_rounds AS r (writer, round) VALUES ($1, 1)
ON CONFLICT (one) DO UPDATE SET writer = $1, round = r.round + 1
RETURNING round;

-- name: pending_lock
-- One recorder at a time, whichever control plane replica runs it: two would append the same
-- changes, and the second's appends would fail on the streams' versions.
SELECT pg_try_advisory_xact_lock(hashtextextended('trainyard.pending-reasons', 0));

-- name: pending_write
-- A round's rows, in one statement: row k is job $1[k] (tenant $2[k], attempt $3[k], stream
-- version $4[k], queued $5[k], position $6[k], reasons $7[k], since $8[k], estimated start
-- $9[k], recorded $10[k]), updated at $11.
INSERT INTO pending_reasons AS p
    (job_id, tenant, attempt, version, queued, position, kinds, reasons, since,
     estimated_start, recorded, updated_at)
SELECT r.job_id, r.tenant, r.attempt, r.version, r.queued, r.position,
       ARRAY(SELECT x ->> 'reason' FROM jsonb_array_elements(r.reasons) x), r.reasons, r.since,
       r.estimated_start, r.recorded, $11
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::int[], $5::bool[], $6::int[],
            $7::jsonb[], $8::timestamptz[], $9::timestamptz[], $10::bool[])
     AS r(job_id, tenant, attempt, version, queued, position, reasons, since, estimated_start,
          recorded)
ON CONFLICT (job_id) DO UPDATE
SET tenant = excluded.tenant, attempt = excluded.attempt, version = excluded.version,
    queued = excluded.queued, position = excluded.position, kinds = excluded.kinds,
    reasons = excluded.reasons, since = excluded.since,
    estimated_start = excluded.estimated_start, recorded = excluded.recorded,
    updated_at = excluded.updated_at;

-- name: pending_now
-- A job's reasons now: NULL when the recorder has not seen it queued yet.
SELECT attempt, queued, position, reasons, since, estimated_start, updated_at
FROM pending_reasons
WHERE job_id = $1;

-- name: pending_close_spans
-- The `pending` projection, for changes of distinct jobs (job $1[k] at $2[k] for attempt $3[k],
-- which left the queue at $4[k], NULL while it has not): each job's open spans end at its
-- change's instant, but for the reasons that still hold ($5[i] of job $6[i]) for its attempt;
-- another attempt's spans all end. A change of an attempt that left ends, of the spans its
-- departure ended, those of reasons that no longer held by then. In one statement for a run of
-- changes: a recording round's hundreds were as many statements, each a round trip.
UPDATE pending_spans s
SET ended_at = c.at
FROM unnest($1::uuid[], $2::timestamptz[], $3::int[], $4::timestamptz[])
     AS c(job_id, at, attempt, left_at)
WHERE s.job_id = c.job_id AND s.ended_at IS NOT DISTINCT FROM c.left_at
  AND (s.attempt <> c.attempt AND c.left_at IS NULL
       OR s.attempt = c.attempt
          AND NOT EXISTS (SELECT 1 FROM unnest($5::uuid[], $6::text[]) AS h(job_id, reason)
                          WHERE h.job_id = s.job_id AND h.reason = s.reason));

-- name: pending_open_spans
-- The `pending` projection, for changes of distinct jobs: spans begin at $6[i] for the reasons
-- (job $1[i], attempt $2[i], reason $3[i], blocking $4[i], detail $5[i]) that were not open
-- already; they end at $7[i], when the attempt left the queue (NULL while it has not).
INSERT INTO pending_spans (job_id, attempt, reason, blocking, detail, started_at, ended_at)
SELECT r.job_id, r.attempt, r.reason, r.blocking, r.detail, r.at, r.left_at
FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
            $7::timestamptz[]) AS r(job_id, attempt, reason, blocking, detail, at, left_at)
WHERE NOT EXISTS (SELECT 1 FROM pending_spans s
                  WHERE s.job_id = r.job_id AND s.attempt = r.attempt AND s.reason = r.reason
                    AND s.ended_at IS NOT DISTINCT FROM r.left_at);

-- name: pending_departed
-- The `pending` projection: attempts of distinct jobs left the queue (job $1[k], attempt $2[k],
-- at $3[k]): each job's open spans of that attempt or an earlier one end, and the departures
-- are kept for a change recorded after them.
WITH kept AS (
    INSERT INTO pending_left (job_id, attempt, left_at)
    SELECT * FROM unnest($1::uuid[], $2::int[], $3::timestamptz[])
    ON CONFLICT (job_id, attempt) DO NOTHING
)
UPDATE pending_spans s
-- Never before the span began: a claim stamped just before a change's instant can commit (and
-- be projected) after it, and a span ending before its start would count negative time.
SET ended_at = greatest(d.left_at, s.started_at)
FROM unnest($1::uuid[], $2::int[], $3::timestamptz[]) AS d(job_id, attempt, left_at)
WHERE s.job_id = d.job_id AND s.ended_at IS NULL AND s.attempt <= d.attempt;

-- name: pending_left_of
-- The `pending` projection: when attempt $2[k] of job $1[k] left the queue (NULL while it has
-- not): its own departure, else the job's end.
SELECT j.job_id,
       (SELECT l.left_at FROM pending_left l
        WHERE l.job_id = j.job_id AND l.attempt >= j.attempt
        ORDER BY l.attempt
        LIMIT 1) AS left_at
FROM unnest($1::uuid[], $2::int[]) AS j(job_id, attempt);

-- name: pending_spans_of
-- A job's spans, oldest first: its pending history.
SELECT attempt, reason, blocking, detail, started_at, ended_at
FROM pending_spans
WHERE job_id = $1
ORDER BY started_at, attempt, reason;

-- name: pending_fingerprint
-- What the reasons are judged from changes only with one of these: the log's tail (nodes and
-- their GPUs change with their events), the queue's, tenants' and claim policy's projections
-- (which apply those events a moment later), and the live allocations (given back without an
-- event). A round that finds them as the last one left them has nothing to do.
SELECT (SELECT position FROM events
        WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
        ORDER BY events.xid DESC, events.position DESC
        LIMIT 1) AS tail,
       ARRAY(SELECT position FROM projection_checkpoints
             WHERE name IN ('jobs', 'scheduling', 'tenants') ORDER BY name) AS projected,
       (SELECT count(*) FROM allocations WHERE released_at IS NULL) AS live;
