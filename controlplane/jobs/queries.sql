-- Jobs' statements: the `jobs` projection (and the hints it sends node agents), listing jobs,
-- jobs' secret environments.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: job_docs
-- The `jobs` projection's folded state of some jobs ($1), to apply a batch's events to: each
-- one's doc, unless the projection holds that version of it already ($2; 0 where it holds
-- none). A row's version is the last of its stream's events folded into it, so the same
-- version is the same doc, and the doc (kilobytes of JSON for the database to write out and
-- send) need not come again: the projection parses the text it kept (`JobsProjection._kept`).
SELECT s.job_id, CASE WHEN s.version <> k.held THEN s.doc END AS doc
FROM unnest($1::uuid[], $2::int[]) AS k (job_id, held)
JOIN job_status s ON s.job_id = k.job_id;

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

-- name: move_job_counts
-- A batch's changes to the counters (job_counts), as arrays: each counter once, with how much
-- it moved (jobs, CPUs, memory). A counter that comes to zero jobs is deleted, not kept at
-- zero: a rebuild folds a job's events in larger batches, never counting it in the states it
-- passed through meanwhile, and must make the very same rows. The new values are computed from
-- the rows read here: batches of the projection are applied one at a time (`lock_projections`),
-- as for job_status.
WITH moved AS (
    SELECT labels, tenant, state, coalesce(c.n, 0) + d.delta AS n,
           coalesce(c.cpus, 0) + d.cpus AS cpus, coalesce(c.memory_mb, 0) + d.memory_mb AS memory_mb
    FROM unnest($1::jsonb[], $2::text[], $3::text[], $4::bigint[], $5::numeric[], $6::bigint[])
         AS d (labels, tenant, state, delta, cpus, memory_mb)
    LEFT JOIN job_counts c USING (labels, tenant, state)
), emptied AS (
    DELETE FROM job_counts c USING moved
    WHERE (c.labels, c.tenant, c.state) = (moved.labels, moved.tenant, moved.state)
      AND moved.n = 0
)
INSERT INTO job_counts (labels, tenant, state, n, cpus, memory_mb)
SELECT labels, tenant, state, n, cpus, memory_mb FROM moved WHERE n <> 0
ON CONFLICT (labels, tenant, state) DO UPDATE
    SET n = excluded.n, cpus = excluded.cpus, memory_mb = excluded.memory_mb;

-- name: list_jobs
-- Planned per call (`plan_per_call`): one tenant's jobs come from its own index, everyone's
-- from the global order.
-- Newest first, optionally one tenant's, filtered by states and labels, after a cursor.
SELECT doc, submitted_at, job_id FROM job_status
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text[] IS NULL OR state = ANY($2::text[]))
  -- No label asked for: no condition at all (planned per call), not a containment of '{}'
  -- that every row meets and the planner cannot see through.
  AND ($3::jsonb = '{}'::jsonb OR labels @> $3::jsonb)
  AND ($4::timestamptz IS NULL OR (submitted_at, job_id) < ($4::timestamptz, $5::uuid))
ORDER BY submitted_at DESC, job_id DESC
LIMIT $6;

-- name: count_jobs
-- How many jobs the same filters match (list_jobs without its cursor and limit): the list
-- shows its total, never a page silently cut. For no label or one label pair ($3 '{}' or
-- '{"K": "V"}'), from the counters (job_counts): at most a row per tenant and state, a range
-- of the primary key, however many jobs were ever run. On 100,000 finished jobs of 8 tenants,
-- counting job_status took 1 ms for a tenant, 4 ms with a label and 8 to 40 ms for everyone's;
-- this, 0.01 ms each. Planned per call, as list_jobs. Two or more label pairs:
-- count_jobs_by_labels.
SELECT coalesce(sum(n), 0)::bigint FROM job_counts
WHERE labels = $3::jsonb
  AND ($1::text IS NULL OR tenant = $1)
  AND ($2::text[] IS NULL OR state = ANY($2::text[]));

-- name: count_jobs_by_labels
-- count_jobs for a filter of two or more label pairs, which the counters do not hold (a
-- counter per combination of a job's labels would be as many as 2^labels a job): the
-- matching rows of job_status are counted, found by the labels' GIN index.
SELECT count(*) FROM job_status
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text[] IS NULL OR state = ANY($2::text[]))
  AND labels @> $3::jsonb;

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

-- name: notify_claimable
-- Wake the node agents' claims (the channel is controlplane.jobs.projection.CLAIMABLE_CHANNEL;
-- a hint, no payload), sent by the `jobs` projection in the transaction that writes the queue
-- rows: an agent woken at its commit finds them, where one woken by the append itself would
-- look before they exist. Payload-free and a channel of its own: agents LISTEN only for the
-- hints that concern them, not for every append (learners' reports, hundreds a second).
SELECT pg_notify('trainyard_claimable', '');

-- name: notify_requests
-- Wake the node agents to carry requests to their learners and to start learners placed on
-- their node by another's claim (the channel is controlplane.jobs.projection.REQUESTS_CHANNEL,
-- the events are `projection.requested`'s; a hint, no payload), sent with the batch as
-- notify_claimable is. A channel apart from that one: a claimable job wakes claims, which a
-- full node skips, and a request wakes the reads of running jobs' streams and of the node's
-- allocations, which a claimable job does not need; neither pays for the other.
SELECT pg_notify('trainyard_requests', '');

-- name: stalled_deployments
-- Attempts still DEPLOYING after their job's deploy timeout: some learner never started.
SELECT s.job_id, s.attempt, (s.doc -> 'manifest' ->> 'deploy_timeout_s')::float AS timeout_s
FROM job_status s
JOIN job_history h ON h.job_id = s.job_id AND h.attempt = s.attempt AND h.event = 'JobDeploying'
WHERE s.state = 'DEPLOYING'
  AND h.at < now() - make_interval(secs => (s.doc -> 'manifest' ->> 'deploy_timeout_s')::float)
ORDER BY s.job_id;
