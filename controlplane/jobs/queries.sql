-- Jobs' statements: the `jobs` projection, listing jobs, jobs' secret environments.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

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

-- name: list_jobs
-- Planned per call (`plan_per_call`): one tenant's jobs come from its own index, everyone's
-- from the global order.
-- Newest first, optionally one tenant's, filtered by states and labels, after a cursor.
SELECT doc, submitted_at, job_id FROM job_status
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text[] IS NULL OR state = ANY($2::text[]))
  -- No label asked for: no condition at all (planned per call), so that the count below can
  -- be answered from an index alone.
  AND ($3::jsonb = '{}'::jsonb OR labels @> $3::jsonb)
  AND ($4::timestamptz IS NULL OR (submitted_at, job_id) < ($4::timestamptz, $5::uuid))
ORDER BY submitted_at DESC, job_id DESC
LIMIT $6;

-- name: count_jobs
-- How many jobs the same filters match (list_jobs without its cursor and limit): the list
-- shows its total, never a page silently cut. Planned per call, as list_jobs: by tenant and
-- state it counts an index only (job_status_tenant_state), never the rows' documents.
SELECT count(*) FROM job_status
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text[] IS NULL OR state = ANY($2::text[]))
  AND ($3::jsonb = '{}'::jsonb OR labels @> $3::jsonb);

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
