-- Every SQL statement the control plane runs, by name. `controlplane.queries` loads this file;
-- a block starts with "-- name: <name>" and its remaining comment lines say what it is for.

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
    INSERT INTO events (stream_id, stream_version, type, schema_version, data, metadata)
    SELECT s.stream_id, s.expected + e.ord, e.type, e.schema_version, e.data, s.metadata
    FROM unnest($4::int[], $5::int[], $6::text[], $7::smallint[], $8::jsonb[])
        AS e(k, ord, type, schema_version, data)
    JOIN streams s USING (k)
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

-- name: notify_events
-- Wake every listener when the transaction commits; the payload means nothing.
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
-- can ever land before the returned events, and a reader never skips or repeats one. With
-- categories $4, the events of other streams come back as their place only (no data, no
-- metadata): a reader moves past them without Postgres rendering their JSON.
SELECT position, xid::text::bigint AS xid, stream_id, stream_version, type, schema_version,
       w.wanted,
       CASE WHEN w.wanted THEN data END AS data,
       CASE WHEN w.wanted THEN metadata END AS metadata,
       recorded_at
FROM events,
     LATERAL (SELECT $4::text[] IS NULL OR split_part(stream_id, '-', 1) = ANY($4::text[]))
         AS w(wanted)
WHERE (xid, position) > ($1::text::xid8, $2::bigint)
  AND xid < pg_snapshot_xmin(pg_current_snapshot())
-- The table's columns, not the output's bigint `xid`: ordered by the cast, Postgres sorted
-- every event after the checkpoint to return the first few, instead of walking the index.
ORDER BY events.xid, events.position
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
ORDER BY events.xid DESC, events.position DESC  -- the index's order (see `read_log`)
LIMIT 1;

-- name: job_docs
-- The `jobs` projection's folded state of some jobs, to apply a batch's events to.
SELECT job_id, doc FROM job_status WHERE job_id = ANY($1::uuid[]);

-- name: upsert_job_status
-- A batch's jobs (each once, folded over the batch) as arrays, one per column.
INSERT INTO job_status (job_id, tenant, name, state, attempt, restarts, priority, labels,
                        submitted_at, updated_at, version, doc, not_before)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $6::int[],
                     $7::int[], $8::jsonb[], $9::timestamptz[], $10::timestamptz[], $11::int[],
                     $12::jsonb[], $13::timestamptz[])
ON CONFLICT (job_id) DO UPDATE
SET state = excluded.state, attempt = excluded.attempt, restarts = excluded.restarts,
    updated_at = excluded.updated_at, version = excluded.version, doc = excluded.doc,
    not_before = excluded.not_before;

-- name: insert_job_history
-- A batch's history rows as arrays, one per column.
INSERT INTO job_history (job_id, version, position, event, state, attempt, at, actor, reason)
SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::int[],
                     $7::timestamptz[], $8::text[], $9::text[]);

-- name: plan_per_call
-- For a transaction whose statement is best planned for its values (sessions plan generically).
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: list_jobs
-- Planned per call (`plan_per_call`): one tenant's jobs come from its own index, everyone's
-- from the global order.
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

-- name: update_tenant
-- The `tenants` projection: a tenant's new weight and quota.
UPDATE tenants SET weight = $2, gpu_quota = $3 WHERE name = $1;

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
-- Every tenant (or only the one named $1) with the ids of its live tokens, oldest first.
SELECT t.name, t.weight, t.gpu_quota, t.created_at,
       -- As text: the code's model reads it (NULL, never set: its defaults).
       coalesce(t.limits, '{}')::text AS limits,
       coalesce(array_agg(k.token_id ORDER BY k.issued_at, k.token_id)
                FILTER (WHERE k.token_id IS NOT NULL), '{}') AS active_tokens
FROM tenants t
LEFT JOIN api_tokens k ON k.tenant = t.name AND k.revoked_at IS NULL
WHERE $1::text IS NULL OR t.name = $1
GROUP BY t.name
ORDER BY t.name;

-- name: set_tenant_limits
-- The `tenants` projection: a tenant's limits from now on (TenantLimitsSet).
UPDATE tenants SET limits = $2::jsonb WHERE name = $1;

-- name: tenant_submission_limits
-- What a submission is checked against, in one round trip: the tenant's limits (as text, NULL:
-- the defaults), its QUEUED jobs, counted from its own queue index (partial, on QUEUED), and the
-- most memory any node ever registered has (NULL: no node yet), since a job needing more could
-- never be placed (every node, not only live ones: a node may be down for a while). No row: no
-- tenant.
SELECT coalesce(t.limits, '{}')::text AS limits,
       (SELECT count(*) FROM job_status s WHERE s.tenant = t.name AND s.state = 'QUEUED')
           AS queued,
       (SELECT max(memory_mb) FROM nodes) AS largest_memory_mb
FROM tenants t
WHERE t.name = $1;

-- name: tenant_limits
-- A tenant's limits (as text; '{}': the defaults), for SSE streams; no row: no tenant.
SELECT coalesce(limits, '{}')::text FROM tenants WHERE name = $1;

-- name: register_node
-- Take (or renew) a node's lease; nothing comes back while another agent holds a live lease
-- on the name: it keeps it, and the newcomer refuses to start.
INSERT INTO nodes AS n (name, agent_id, state, lease_until, heartbeat_at, registered_at,
                        runtime, cpus, memory_mb)
VALUES ($1, $2, 'READY', now() + make_interval(secs => $3), now(), now(), $4, $5, $6)
ON CONFLICT (name) DO UPDATE
SET agent_id = excluded.agent_id, state = 'READY', lease_until = excluded.lease_until,
    heartbeat_at = excluded.heartbeat_at, registered_at = excluded.registered_at,
    runtime = excluded.runtime, cpus = excluded.cpus, memory_mb = excluded.memory_mb
WHERE n.lease_until < now() OR n.state <> 'READY' OR n.agent_id = excluded.agent_id
RETURNING lease_until;

-- name: node_lease_holder
SELECT agent_id, lease_until, heartbeat_at FROM nodes WHERE name = $1;

-- name: forget_node_gpus
DELETE FROM node_gpus WHERE node = $1;

-- name: insert_node_gpu
INSERT INTO node_gpus (node, index, uuid, model, memory_mb, healthy, health_reason)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: set_gpu_health
UPDATE node_gpus SET healthy = $3, health_reason = $4 WHERE node = $1 AND uuid = $2;

-- name: renew_lease
-- Nothing comes back when the lease is no longer this agent's (it expired and was taken).
UPDATE nodes SET lease_until = now() + make_interval(secs => $3), heartbeat_at = now()
WHERE name = $1 AND agent_id = $2 AND state = 'READY'
RETURNING lease_until;

-- name: deregister_node
UPDATE nodes SET state = 'GONE', lease_until = now()
WHERE name = $1 AND agent_id = $2;

-- name: list_nodes
SELECT n.name, n.state, n.lease_until, n.heartbeat_at, n.registered_at, n.runtime, n.cpus,
       n.memory_mb, n.lease_until < now() AS expired,
       coalesce((SELECT json_agg(json_build_object(
                    'index', g.index, 'uuid', g.uuid, 'model', g.model,
                    'memory_mb', g.memory_mb, 'healthy', g.healthy,
                    'health_reason', g.health_reason, 'job_id', a.job_id,
                    'attempt', a.attempt, 'learner', a.learner)
                  ORDER BY g.index)
                 FROM node_gpus g LEFT JOIN allocated_gpus a ON a.gpu_uuid = g.uuid
                 WHERE g.node = n.name), '[]') AS gpus,
       coalesce((SELECT sum(a.cpus) FROM allocations a
                 WHERE a.node = n.name AND a.released_at IS NULL), 0) AS cpus_allocated,
       coalesce((SELECT sum(a.memory_mb) FROM allocations a
                 WHERE a.node = n.name AND a.released_at IS NULL), 0) AS memory_mb_allocated
FROM nodes n
ORDER BY n.name;

-- name: claim_candidates
-- Up to $2 queued jobs that node $1 (READY, else no rows) can take, with the node's free GPUs,
-- CPUs and memory, in the order a claim takes them: fair share first (the tenant holding the
-- fewest GPUs for its weight, counting the jobs before it in this list as held), then priority,
-- then submission time; within the tenant's GPU quota (again counting the jobs before it). Each
-- job fits the node's free room on its own; `claims.claim` takes them in order while they fit
-- together. A job fits when all of it fits here, or, with several learners, when one learner
-- fits here and the READY nodes together have room for them all, counted node by node as
-- `scheduling.placement.place` places them. Each tenant's best fitting jobs come from one scan
-- of its queue index, locked with SKIP LOCKED so that concurrent agents each take different jobs
-- instead of queueing on one row (the rows locked but not taken are released when the claim
-- commits). One statement: a claim is on every job's critical path. The same order, stated in
-- Python, is `scheduling.claim_order.claim_order`; tests/controlplane/scheduling/test_claim_order.py holds the two
-- together, so change them together.
WITH free AS MATERIALIZED (
    SELECT * FROM node_capacity WHERE name = $1
), usage AS (
    SELECT tenant, sum(cardinality(gpus)) AS gpus
    FROM allocations WHERE released_at IS NULL
    GROUP BY tenant
), fitting AS (
    SELECT c.*, coalesce(u.gpus, 0) AS held, t.weight, t.gpu_quota,
           sum(c.learners * c.gpus_per_learner) OVER (
               PARTITION BY c.tenant
               ORDER BY c.priority DESC, c.submitted_at, c.job_id
           ) AS taken
    FROM free f
    CROSS JOIN tenants t
    LEFT JOIN usage u ON u.tenant = t.name
    CROSS JOIN LATERAL (
        SELECT s.job_id, s.attempt, s.tenant, s.learners, s.gpus_per_learner,
               s.cpus_per_learner, s.memory_mb_per_learner, s.priority, s.submitted_at,
               s.version, s.doc, f.gpus AS free_gpus, f.cpus AS free_cpus,
               f.memory_mb AS free_memory_mb
        FROM job_status s
        WHERE s.tenant = t.name
          AND s.state = 'QUEUED'
          AND (s.not_before IS NULL OR s.not_before <= now())
          AND ((s.learners * s.gpus_per_learner <= cardinality(f.gpus)
                AND s.learners * s.cpus_per_learner <= f.cpus
                AND s.learners * s.memory_mb_per_learner <= f.memory_mb)
               OR (s.learners > 1
                   AND s.gpus_per_learner <= cardinality(f.gpus)
                   AND s.cpus_per_learner <= f.cpus
                   AND s.memory_mb_per_learner <= f.memory_mb
                   AND s.learners <= (
                       SELECT sum(least(
                           CASE WHEN s.gpus_per_learner > 0
                                THEN cardinality(n.gpus) / s.gpus_per_learner
                                ELSE s.learners END,
                           floor(n.cpus / s.cpus_per_learner),
                           -- Whole learners: the view's memory is numeric, whose division
                           -- keeps fractions, and half a learner's room on each of two nodes
                           -- holds no learner.
                           floor(n.memory_mb / s.memory_mb_per_learner)))
                       FROM node_capacity n)))
          AND (t.gpu_quota IS NULL
               OR coalesce(u.gpus, 0) + s.learners * s.gpus_per_learner <= t.gpu_quota)
          -- Claimed already, but the projection has not applied the JobDeploying event yet.
          -- (OFFSET 0 keeps this a probe of the allocations' primary key for each candidate:
          -- turned into an anti-join, it scanned every allocation ever made for each, once
          -- statistics said the table had grown.)
          AND NOT EXISTS (SELECT 1 FROM allocations a
                          WHERE a.job_id = s.job_id AND a.attempt = s.attempt OFFSET 0)
        ORDER BY s.priority DESC, s.submitted_at, s.job_id
        -- No more than could fit together (GPU jobs: one a free GPU), so that jobs this claim
        -- cannot take stay free for other nodes.
        LIMIT least($2, greatest(cardinality(f.gpus), 1))
        FOR UPDATE OF s SKIP LOCKED
    ) c
), candidates AS (
    SELECT * FROM fitting
    WHERE gpu_quota IS NULL OR held + taken <= gpu_quota
    -- The tenant's share just before this job: what it holds and the jobs before it here.
    ORDER BY (held + taken - learners * gpus_per_learner) / weight,
             priority DESC, submitted_at, job_id
    LIMIT $2
)
-- Fencing epochs too: a sequence is not transactional, so a claim rolled back only skips
-- numbers, and epochs still only grow. And each job's trace context, from its first event.
SELECT c.*, nextval('claim_epochs') AS epoch,
       (SELECT e.metadata -> 'trace' FROM events e
        WHERE e.stream_id = 'job-' || c.job_id AND e.stream_version = 1) AS trace
FROM candidates c
ORDER BY (held + taken - learners * gpus_per_learner) / weight,
         priority DESC, submitted_at, job_id;

-- name: other_nodes_capacity
-- What the other READY nodes can still give, roomiest first: where a claim places the learners
-- that do not fit on the claiming node.
SELECT name, gpus, cpus, memory_mb FROM node_capacity
WHERE name <> $1
ORDER BY cardinality(gpus) DESC, name;

-- name: insert_allocations
-- Claims' learners and their GPUs in one statement: learner row k is learner $3[k] of attempt
-- $2[k] of job $1[k], for tenant $4[k] on node $5[k] with epoch $6[k], $7[k] CPUs and $8[k] MiB;
-- GPU $9[g] belongs to learner row $10[g].
WITH learners AS (
    INSERT INTO allocations (job_id, attempt, learner, tenant, node, epoch, gpus, cpus,
                             memory_mb)
    SELECT l.job_id, l.attempt, l.learner, l.tenant, l.node, l.epoch,
           coalesce((SELECT array_agg(g.gpu ORDER BY g.n)
                     FROM unnest($9::text[], $10::int[]) WITH ORDINALITY AS g(gpu, k, n)
                     WHERE g.k = l.k), '{}'),
           l.cpus, l.memory_mb
    FROM unnest($1::uuid[], $2::int[], $3::int[], $4::text[], $5::text[], $6::bigint[],
                $7::float8[], $8::bigint[])
        WITH ORDINALITY AS l(job_id, attempt, learner, tenant, node, epoch, cpus, memory_mb, k)
)
INSERT INTO allocated_gpus (gpu_uuid, job_id, attempt, learner)
SELECT g.gpu, ($1::uuid[])[g.k], ($2::int[])[g.k], ($3::int[])[g.k]
FROM unnest($9::text[], $10::int[]) AS g(gpu, k)
-- In one global order: claims racing for GPUs of several nodes wait for each other in the same
-- order, so they never deadlock (the later one fails on the GPU's key, and retries).
ORDER BY g.gpu;

-- name: node_allocations
-- A node's live allocations, learner by learner: what a restarted agent must account for.
SELECT job_id, attempt, learner, node, epoch, gpus FROM allocations
WHERE node = $1 AND released_at IS NULL
ORDER BY job_id, attempt, learner;

-- name: release_allocations
-- Give back the learners on node $3 of attempts ($1[k], $2[k]), and their GPUs.
WITH released AS (
    UPDATE allocations a SET released_at = now()
    FROM unnest($1::uuid[], $2::int[]) AS r(job_id, attempt)
    WHERE a.job_id = r.job_id AND a.attempt = r.attempt AND a.node = $3
      AND a.released_at IS NULL
    RETURNING a.job_id, a.attempt, a.learner
)
DELETE FROM allocated_gpus g USING released r
WHERE g.job_id = r.job_id AND g.attempt = r.attempt AND g.learner = r.learner;

-- name: stream_version
SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1;

-- name: reserve_log_ids
-- Learner logs: lock the heads of the jobs a batch writes to and take ids for its lines
-- ($2 per job). The row locks last until the writer commits, so the next writer of a job waits
-- here and ids commit in increasing order: a reader's `id > cursor` never skips a late commit.
-- Heads are locked in job_id order, so writers of overlapping sets of jobs cannot deadlock.
-- `updated_at` is the time the lock was granted, not the start of a wait for it.
INSERT INTO job_log_heads AS h (job_id, last_id, updated_at)
SELECT b.job_id, b.lines, clock_timestamp()
FROM unnest($1::uuid[], $2::bigint[]) AS b(job_id, lines)
ORDER BY b.job_id
ON CONFLICT (job_id) DO UPDATE
SET last_id = h.last_id + excluded.last_id, updated_at = clock_timestamp()
RETURNING job_id, last_id;

-- name: advance_log_series
-- Run after `reserve_log_ids` in the same transaction, so that its snapshot holds every earlier
-- writer's lines: the last stored seq of each series of the batch, and the batch's last seqs
-- recorded in their place. The writer leaves out lines at or below the stored seq, so a retried
-- batch, or an agent resuming after a restart, never stores a line twice.
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::integer[], $3::integer[], $4::text[], $5::bigint[])
        AS b(job_id, attempt, learner, stream, last_seq)
), stored AS (
    SELECT s.job_id, s.attempt, s.learner, s.stream, s.last_seq
    FROM job_log_series s JOIN batch b USING (job_id, attempt, learner, stream)
), advanced AS (
    INSERT INTO job_log_series AS s (job_id, attempt, learner, stream, last_seq)
    SELECT job_id, attempt, learner, stream, last_seq FROM batch
    ON CONFLICT (job_id, attempt, learner, stream) DO UPDATE
    SET last_seq = greatest(s.last_seq, excluded.last_seq)
)
SELECT job_id, attempt, learner, stream, last_seq FROM stored;

-- name: log_last_seqs
-- Where an agent resumes shipping an attempt's output: the last stored seq of each series.
SELECT learner, stream, last_seq FROM job_log_series WHERE job_id = $1 AND attempt = $2;

-- name: job_log_usage
-- What a job has logged so far, over all its attempts (markers included): where an agent starts
-- counting towards the job's log limits, after a restart too. `last_id` counts the job's lines;
-- their bytes are summed over the job's rows (a walk of its primary key, bounded by the limits)
-- by `job_log_bytes`, as agents may not read the lines themselves (migration 0017).
SELECT coalesce((SELECT last_id FROM job_log_heads WHERE job_id = $1), 0) AS lines,
       job_log_bytes($1) AS bytes;

-- name: job_log_last_id
-- Where a log feed starts reading a job's new lines: its last id stored (committed with them,
-- so that every line up to it is readable).
SELECT coalesce((SELECT last_id FROM job_log_heads WHERE job_id = $1), 0);

-- name: read_job_logs
-- A job's lines after a cursor, in id order (the order they were stored in), optionally of one
-- attempt and one learner.
SELECT id, attempt, learner, stream, seq, at, line
FROM job_logs
WHERE job_id = $1 AND id > $2
  AND ($3::integer IS NULL OR attempt = $3)
  AND ($4::integer IS NULL OR learner = $4)
ORDER BY id
LIMIT $5;

-- name: job_log_quiet_s
-- Seconds (by the database's clock) since the last of: a batch of the job's lines stored, one
-- of its learners ended (its allocation released), and $2 (when the job ended). NULL while a
-- learner of the job is still allocated, since more lines may come.
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM allocations WHERE job_id = $1 AND released_at IS NULL) THEN NULL
    ELSE extract(epoch FROM now() - greatest(
        (SELECT updated_at FROM job_log_heads WHERE job_id = $1),
        (SELECT max(released_at) FROM allocations WHERE job_id = $1),
        $2::timestamptz
    ))::float8
END;

-- name: live_nodes
-- What the biggest live node offers (each kind on its own), and the live nodes' healthy GPUs
-- together: whether a job could ever fit.
SELECT count(*) AS nodes,
       coalesce(max(g.healthy), 0) AS gpus,
       coalesce(sum(g.healthy), 0) AS total_gpus,
       coalesce(max(n.cpus), 0) AS cpus,
       coalesce(max(n.memory_mb), 0) AS memory_mb
FROM nodes n
CROSS JOIN LATERAL (SELECT count(*) AS healthy FROM node_gpus g
                    WHERE g.node = n.name AND g.healthy) g
WHERE n.state = 'READY';

-- name: job_metric_lines
-- The learner reports among a job's log lines that carry metrics, in the order stored.
SELECT attempt, learner, line FROM job_logs
WHERE job_id = $1 AND stream = 'stdout' AND line LIKE '@@trainyard/1 {%"kind":"metric"%'
ORDER BY id;

-- name: manager_lock
-- Held by the active lifecycle manager's own session: it ends with that session, so a replica
-- that dies hands the role on without anyone having to notice first.
SELECT pg_try_advisory_lock(hashtextextended('trainyard.lifecycle-manager', 0));

-- name: stalled_deployments
-- Attempts still DEPLOYING after their job's deploy timeout: some learner never started.
SELECT s.job_id, s.attempt, (s.doc -> 'manifest' ->> 'deploy_timeout_s')::float AS timeout_s
FROM job_status s
JOIN job_history h ON h.job_id = s.job_id AND h.attempt = s.attempt AND h.event = 'JobDeploying'
WHERE s.state = 'DEPLOYING'
  AND h.at < now() - make_interval(secs => (s.doc -> 'manifest' ->> 'deploy_timeout_s')::float)
ORDER BY s.job_id;

-- name: expired_nodes
SELECT name FROM nodes WHERE state = 'READY' AND lease_until < now() ORDER BY name;

-- name: mark_node_lost
-- Nothing comes back if the agent renewed its lease meanwhile (or another manager was first).
UPDATE nodes SET state = 'LOST'
WHERE name = $1 AND state = 'READY' AND lease_until < now()
RETURNING agent_id;

-- name: node_attempts
-- The job attempts that still hold resources on a node.
SELECT DISTINCT job_id, attempt FROM allocations
WHERE node = $1 AND released_at IS NULL
ORDER BY job_id;

-- name: queue_depth
-- Metrics: every tenant's QUEUED jobs (those waiting out a restart backoff too); 0 included.
SELECT t.name AS tenant, count(s.job_id) AS jobs
FROM tenants t
LEFT JOIN job_status s ON s.tenant = t.name AND s.state = 'QUEUED'
GROUP BY t.name;

-- name: gpus_by_node
-- Metrics: the GPUs each READY node offers.
SELECT n.name AS node, count(g.uuid) AS gpus
FROM nodes n
LEFT JOIN node_gpus g ON g.node = n.name
WHERE n.state = 'READY'
GROUP BY n.name;

-- name: gpus_allocated
-- Metrics: the GPUs held by job attempts, per tenant and node.
SELECT tenant, node, sum(cardinality(gpus)) AS gpus
FROM allocations
WHERE released_at IS NULL
GROUP BY tenant, node;

-- name: job_submissions
-- The first event (the submission) of some job streams.
SELECT stream_id, type, schema_version, data FROM events
WHERE stream_id = ANY($1::text[]) AND stream_version = 1;

-- name: insert_webhook_deliveries
-- The `webhook_outbox` projection: a batch's deliveries as arrays, one per column. No ON
-- CONFLICT: the checkpoint moves in the same transaction, so an event never comes twice, and
-- the unique position would refuse it if it did.
INSERT INTO webhook_deliveries (delivery_id, position, job_id, tenant, event, url, body)
SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::uuid[], $4::text[], $5::text[], $6::text[],
                     $7::text[]);

-- name: notify_webhooks
-- Wake the relays (the channel is controlplane.webhooks.outbox.CHANNEL); a hint, no payload.
SELECT pg_notify('trainyard_webhooks', '');

-- name: claim_webhook_deliveries
-- Take up to $1 due deliveries for one attempt each, under claim $2: the attempt is counted,
-- and the row is not due again until the claim's lease ($3 seconds) has passed, so a relay
-- that dies mid-attempt leaves it for another. SKIP LOCKED: concurrent relays each take other
-- rows instead of queueing on the same ones. The row locks last only for this statement, never
-- across the POST. With the tenant's signing secrets: the current one first, then those
-- retired less than $4 seconds ago (a rotation's grace period).
UPDATE webhook_deliveries d
SET attempts = d.attempts + 1, claim = $2, next_attempt_at = now() + make_interval(secs => $3)
FROM (
    SELECT delivery_id FROM webhook_deliveries
    WHERE state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) due
WHERE d.delivery_id = due.delivery_id
RETURNING d.delivery_id, d.job_id, d.tenant, d.event, d.position, d.url, d.body, d.attempts,
          coalesce((SELECT array_agg(s.secret ORDER BY s.retired_at DESC NULLS FIRST)
                    FROM webhook_secrets s
                    WHERE s.tenant = d.tenant
                      AND (s.retired_at IS NULL
                           OR s.retired_at > now() - make_interval(secs => $4))),
                   '{}') AS secrets;

-- name: webhook_next_due
-- Seconds until the next pending delivery is due (negative: overdue); NULL when none is pending.
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8
FROM webhook_deliveries WHERE state = 'pending';

-- name: lock_webhook_stream
-- Writers of one job's webhook stream take turns. Taken before the transaction writes anything
-- (so before it has an xid): the stream's head was then always written by an older transaction,
-- as the event store's ordering rule requires, and the next version is never taken meanwhile.
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.webhook-stream:' || $1, 0));

-- name: finish_webhook_attempt
-- Record an attempt's outcome, only under the claim it was made with: nothing comes back when
-- the claim lapsed and another relay claimed the delivery since. State $3; for 'pending', the
-- next attempt is due at $4.
UPDATE webhook_deliveries
SET state = $3, next_attempt_at = coalesce($4, next_attempt_at), claim = NULL,
    last_status = $5, last_error = $6,
    finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE $7::timestamptz END
WHERE delivery_id = $1 AND claim = $2
RETURNING attempts;

-- name: lock_webhook_secrets
-- Rotations of one tenant's webhook secret take turns (each retires what the one before issued).
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.webhook-secret:' || $1, 0));

-- name: has_webhook_secret
SELECT EXISTS (SELECT 1 FROM webhook_secrets WHERE tenant = $1 AND retired_at IS NULL);

-- name: retire_webhook_secret
-- Nothing comes back when the tenant had no current secret.
UPDATE webhook_secrets SET retired_at = $2 WHERE tenant = $1 AND retired_at IS NULL
RETURNING secret_id;

-- name: insert_webhook_secret
INSERT INTO webhook_secrets (secret_id, tenant, secret, created_at) VALUES ($1, $2, $3, $4);

-- name: webhook_signing_secrets
-- A tenant's secrets that deliveries are signed with: the current one first, then those
-- retired less than $2 seconds ago.
SELECT secret_id, secret, created_at, retired_at FROM webhook_secrets
WHERE tenant = $1 AND (retired_at IS NULL OR retired_at > now() - make_interval(secs => $2))
ORDER BY retired_at DESC NULLS FIRST;

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1);

-- name: create_agent_login_statement
-- CREATE ROLE takes no parameters: the server quotes the name and the SCRAM verifier itself.
-- The verifier was computed by the client, so the password is never sent, and a server that
-- logs DDL logs only the verifier. The login is a member of trainyard_agent and of nothing
-- else, with none of the attributes that would give it more.
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L NOSUPERUSER NOCREATEDB NOCREATEROLE '
              'NOREPLICATION NOBYPASSRLS IN ROLE trainyard_agent', $1::text, $2::text);

-- name: login_excess
-- What the session's login may do beyond the agent role: its attributes, the tables of this
-- database it owns (through any role it belongs to), and the roles it belongs to that the
-- agent role does not. A superuser belongs to every role: that one word says it all.
SELECT CASE WHEN r.rolsuper THEN ARRAY['superuser'] ELSE array_remove(ARRAY[
           CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
           CASE WHEN r.rolcreatedb THEN 'CREATEDB' END,
           CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END,
           CASE WHEN r.rolreplication THEN 'REPLICATION' END,
           CASE WHEN EXISTS (SELECT 1 FROM pg_class c
                             WHERE c.relnamespace = 'public'::regnamespace
                               AND pg_has_role(r.oid, c.relowner, 'MEMBER'))
                THEN 'owns the tables' END
       ], NULL) || ARRAY(
           SELECT 'member of ' || m.rolname FROM pg_roles m
           WHERE m.oid <> r.oid AND m.rolname <> 'trainyard_agent'
             AND pg_has_role(r.oid, m.oid, 'MEMBER')
             AND NOT pg_has_role('trainyard_agent', m.oid, 'MEMBER')
           ORDER BY m.rolname)
       END AS excess
FROM pg_roles r
WHERE r.rolname = session_user;

-- name: insert_job_secret_env
-- A job's secret environment variables, written in the transaction that appends its
-- JobSubmitted: kept apart from the event log, which is kept forever and read by auditors.
INSERT INTO job_secret_env (job_id, tenant, env) VALUES ($1, $2, $3::jsonb);

-- name: job_secret_env
-- The secret environment variables an agent gives a job's learners as it starts an attempt
-- (NULL when the job has none, or has ended and they were deleted).
SELECT env::text FROM job_secret_env WHERE job_id = $1;

-- name: delete_job_secret_env
-- The `jobs` projection forgets the secrets of jobs that have ended: no attempt will need them.
DELETE FROM job_secret_env WHERE job_id = ANY($1::uuid[]);
