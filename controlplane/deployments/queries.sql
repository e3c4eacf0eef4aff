-- Serving: the deployments and pipelines read models (projection.py), and the task queue
-- (tasks.py for the API's side, node_agent/serving.py for the replicas'). One NOTIFY channel,
-- `serving`, wakes both sides: its payload names a deployment's queue ('<tenant>.<name>': that
-- deployment's feeds wake) or 'results' (the API's waiters wake); a hint only, both also poll
-- (wakeups.py). Postgres sends a transaction's identical notifications once.

-- name: upsert_deployment
-- Projection: a deployment created (again, after a deletion: the same row, renewed).
INSERT INTO deployments (tenant, name, model_tenant, model_name, reference, version,
                         artifact_sha256, entry_point, spec, replicas, replica_jobs, deleted,
                         created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, '{}', false, $11, $11)
ON CONFLICT (tenant, name) DO UPDATE SET
    model_tenant = excluded.model_tenant, model_name = excluded.model_name,
    reference = excluded.reference, version = excluded.version,
    artifact_sha256 = excluded.artifact_sha256, entry_point = excluded.entry_point,
    spec = excluded.spec, replicas = excluded.replicas, deleted = false,
    created_at = excluded.created_at, updated_at = excluded.updated_at,
    canary_version = NULL, canary_weight = NULL, canary_jobs = '{}', canary_rollback = NULL,
    canary_started_at = NULL;

-- name: scale_deployment
-- Projection: a new number of replicas asked for.
UPDATE deployments SET replicas = $3, updated_at = $4 WHERE tenant = $1 AND name = $2;

-- name: set_deployment_autoscaling
-- Projection: autoscaling turned on or changed ($3), or off (NULL: the key goes, as a fixed
-- deployment's spec never had it).
UPDATE deployments
SET spec = CASE WHEN $3::jsonb IS NULL THEN spec - 'autoscaling'
                ELSE jsonb_set(spec, '{autoscaling}', $3::jsonb) END,
    updated_at = $4
WHERE tenant = $1 AND name = $2;

-- name: add_replica
-- Projection: a replica job started.
UPDATE deployments SET replica_jobs = array_append(replica_jobs, $3)
WHERE tenant = $1 AND name = $2;

-- name: add_canary_replica
-- Projection: a replica job of the canary started (in both lists: a deleted deployment's
-- reconcile finds every replica it has by `replica_jobs`).
UPDATE deployments SET replica_jobs = array_append(replica_jobs, $3),
                       canary_jobs = array_append(canary_jobs, $3)
WHERE tenant = $1 AND name = $2;

-- name: remove_replica
-- Projection: a replica job retired (the deployment's or its canary's).
UPDATE deployments SET replica_jobs = array_remove(replica_jobs, $3),
                       canary_jobs = array_remove(canary_jobs, $3)
WHERE tenant = $1 AND name = $2;

-- name: start_canary
-- Projection: a canary started beside the deployment ($3 version, $4 weight, $5 rule, $6 at).
UPDATE deployments SET canary_version = $3, canary_weight = $4, canary_rollback = $5::jsonb,
                       canary_started_at = $6, canary_jobs = '{}', updated_at = $6
WHERE tenant = $1 AND name = $2;

-- name: set_canary_weight
-- Projection: the canary's share moved.
UPDATE deployments SET canary_weight = $3, updated_at = $4 WHERE tenant = $1 AND name = $2;

-- name: promote_canary
-- Projection: the canary's version became the deployment's, its replicas the deployment's (the
-- old ones were removed by their ReplicaRetired, in the same append).
UPDATE deployments
SET reference = $3, version = $4, artifact_sha256 = $5, entry_point = $6,
    canary_version = NULL, canary_weight = NULL, canary_jobs = '{}', canary_rollback = NULL,
    canary_started_at = NULL, updated_at = $7
WHERE tenant = $1 AND name = $2;

-- name: end_canary
-- Projection: the canary rolled back (its replicas removed by their ReplicaRetired).
UPDATE deployments
SET canary_version = NULL, canary_weight = NULL, canary_jobs = '{}', canary_rollback = NULL,
    canary_started_at = NULL, updated_at = $3
WHERE tenant = $1 AND name = $2;

-- name: delete_deployment
-- Projection: deleted; the row stays until its replicas have stopped (the manager stops them).
UPDATE deployments SET deleted = true, updated_at = $3 WHERE tenant = $1 AND name = $2;

-- name: insert_pipeline
-- Projection: a pipeline defined.
INSERT INTO pipelines (tenant, name, steps, created_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, name) DO UPDATE SET steps = excluded.steps, created_at = excluded.created_at;

-- name: delete_pipeline
-- Projection: a pipeline removed.
DELETE FROM pipelines WHERE tenant = $1 AND name = $2;

-- name: list_deployments
-- GET /v1/deployments: the tenant's deployments, by name (deleted ones only while stopping).
SELECT * FROM deployments WHERE tenant = $1 AND (NOT deleted OR cardinality(replica_jobs) > 0)
ORDER BY name;

-- name: live_deployments
-- The lifecycle manager's reconcile: every deployment that has replicas to start or stop.
SELECT tenant, name FROM deployments WHERE NOT deleted OR cardinality(replica_jobs) > 0;

-- name: autoscaled_loads
-- The controller's autoscaler (autoscaler.py): each autoscaled deployment's load, read from the
-- rows its requests leave whichever path they took (a direct prediction's row is written moments
-- after its answer, stamped with its arrival), so every control plane's requests count and
-- nothing is written for it. $1: the look-back, in seconds. Per deployment, by its indexes: its
-- tasks queued or running (the partial indexes), those finished within the look-back (each
-- task's time in flight within it, summed: over $1, the mean in flight), its latest finish and
-- its latest arrival (the last entry of (tenant, deployment, submitted_at)), for how long it has
-- been idle. The latest finish is the last entry of (tenant, deployment, finished_at), however
-- long ago: looked for within the look-back alone, once it fell out of it the idle time ran
-- from the last arrival instead, longer by that request's time in flight, and the deployment
-- went to zero that much before it had been idle for the delay (4.975 s for a delay of 5 s).
SELECT d.tenant, d.name, o.unfinished, o.waiting,
       (o.busy_s + f.busy_s) / $1 AS mean_in_flight,
       CASE WHEN o.unfinished > 0 THEN 0
            ELSE greatest(0, extract(epoch FROM
                     now() - greatest(e.last_finished_at, l.last_arrival, d.created_at)))
       END::float8 AS idle_s
FROM deployments d
CROSS JOIN LATERAL (
    SELECT count(*) AS unfinished, count(*) FILTER (WHERE t.state = 'queued') AS waiting,
           coalesce(sum(greatest(0, extract(epoch FROM
               now() - greatest(t.submitted_at, now() - make_interval(secs => $1))))), 0)
               AS busy_s
    FROM serving_tasks t
    WHERE t.tenant = d.tenant AND t.deployment = d.name AND t.state IN ('queued', 'running')
) o
CROSS JOIN LATERAL (
    SELECT coalesce(sum(extract(epoch FROM
               t.finished_at - greatest(t.submitted_at, now() - make_interval(secs => $1)))), 0)
               AS busy_s
    FROM serving_tasks t
    WHERE t.tenant = d.tenant AND t.deployment = d.name
      AND t.finished_at > now() - make_interval(secs => $1)
) f
CROSS JOIN LATERAL (
    SELECT max(t.finished_at) AS last_finished_at FROM serving_tasks t
    WHERE t.tenant = d.tenant AND t.deployment = d.name
) e
CROSS JOIN LATERAL (
    SELECT max(t.submitted_at) AS last_arrival FROM serving_tasks t
    WHERE t.tenant = d.tenant AND t.deployment = d.name
) l
WHERE NOT d.deleted AND d.spec ? 'autoscaling';

-- name: replica_states
-- A deployment's replica jobs as the jobs projection has them (its view's `replicas`).
SELECT job_id, state, attempt, restarts FROM job_status WHERE job_id = ANY($1::uuid[]);

-- name: insert_task
-- POST .../predict: a task queued, and the replicas woken (one NOTIFY, in this transaction).
WITH task AS (
    INSERT INTO serving_tasks (task_id, tenant, pipeline, steps, deployment, items, input,
                               state, memo, memo_key, submitted_at, version)
    VALUES ($1, $2, $3, $4::text[], ($4::text[])[1], $5, $6::jsonb, 'queued', $7, $8, now(),
            $9)
    -- A retry of an idempotent request (the same task id) finds its task and adds nothing.
    ON CONFLICT (task_id) DO NOTHING
    RETURNING tenant, deployment
)
SELECT count(*) AS queued, count(pg_notify('serving', tenant || '.' || deployment)) AS woken
FROM task;

-- name: memo_hit
-- POST .../predict, memoized: the stored result, if any, recorded as a task answered from it
-- (so hits are counted like every task, and re-derivable with SQL) in one statement.
WITH hit AS (
    UPDATE serving_memo SET used_at = now()
    WHERE tenant = $2 AND deployment = $3 AND key = $4
    RETURNING output
)
INSERT INTO serving_tasks (task_id, tenant, steps, deployment, items, input, state, output,
                           memo, memo_key, submitted_at, finished_at)
SELECT $1, $2, ARRAY[$3], $3, $5, $6::jsonb, 'succeeded', hit.output, 'hit', $4, now(), now()
FROM hit
ON CONFLICT (task_id) DO NOTHING
RETURNING *;

-- name: get_task
-- GET /v1/tasks/{id}: a task of the tenant's.
SELECT * FROM serving_tasks WHERE task_id = $1 AND tenant = $2;

-- name: cancel_task
-- POST /v1/tasks/{id}/cancel: a task of the tenant's not yet finished fails, saying so. Queued,
-- it is never claimed; running, its replica's result is fenced out (finish_tasks records only a
-- running task under its claim) and never delivered; its waiters are woken. No row: it has no
-- such task unfinished.
WITH cancelled AS (
    UPDATE serving_tasks SET state = 'failed', claim = NULL, finished_at = now(),
        error = 'cancelled by its owner'
    WHERE task_id = $1 AND tenant = $2 AND state IN ('queued', 'running')
    RETURNING *
), woken AS (
    SELECT pg_notify('serving', 'results') FROM cancelled
)
SELECT c.* FROM cancelled c, (SELECT count(*) FROM woken) w;

-- name: finished_tasks
-- Waiting for results: which of these tasks have finished.
SELECT * FROM serving_tasks WHERE task_id = ANY($1::uuid[]) AND state IN ('succeeded', 'failed');

-- name: claim_tasks
-- A replica's batch: its deployment's oldest queued tasks, up to max_batch_size items (the
-- first task always, however many items it has: the agent splits it into calls of at most
-- max_batch_size). A task tried before (its replica was lost, or hung) runs alone: were it
-- what killed the replica, it kills no other task's try. SKIP LOCKED: replicas of the
-- deployment never wait for each other. A fresh claim token each batch fences the results
-- (finish_tasks). The tasks the batch holds under it besides $6 (those its replica knows of)
-- come back instead of new ones: a claim whose answer was lost (it committed on a primary
-- that died before answering; the standby promoted has it) and that is tried again gets
-- them, rather than leaving them running under a replica that never runs them, until the
-- replica is replaced for holding them past their timeout. A task sent to a model version
-- (`version`, chosen by a canary's weight; NULL: the deployment's own) is claimed only by that
-- version's replicas (replica_version, migration 0045).
WITH serves AS (
    SELECT own, mine FROM replica_version($1, $2, $5)
), held AS (
    SELECT task_id, items, input, submitted_at FROM serving_tasks
    WHERE state = 'running' AND claim = $4 AND replica = $5 AND tenant = $1
      AND deployment = $2 AND task_id <> ALL($6::uuid[])
), candidates AS (
    SELECT task_id, items, submitted_at, tries FROM serving_tasks
    WHERE tenant = $1 AND deployment = $2 AND state = 'queued'
      AND NOT EXISTS (SELECT 1 FROM held)
      AND NOT EXISTS (SELECT 1 FROM serves s
                      WHERE coalesce(version, s.own) IS DISTINCT FROM s.mine)
    ORDER BY submitted_at, task_id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), counted AS (
    SELECT task_id, tries, sum(items) OVER (ORDER BY submitted_at, task_id) AS upto,
           row_number() OVER (ORDER BY submitted_at, task_id) AS n,
           bool_or(tries > 0) OVER (ORDER BY submitted_at, task_id) AS after_a_retry
    FROM candidates
), claimed AS (
    UPDATE serving_tasks t
    SET state = 'running', claim = $4, replica = $5, claimed_at = now(), tries = t.tries + 1
    FROM counted c
    WHERE t.task_id = c.task_id
      AND (c.n = 1 OR (c.upto <= $3 AND NOT c.after_a_retry))
    RETURNING t.task_id, t.items, t.input, t.submitted_at
)
SELECT task_id, items, input, (extract(epoch FROM now() - submitted_at) * 1000)::float8 AS age_ms
FROM (SELECT * FROM claimed UNION ALL SELECT * FROM held) AS taken;

-- name: finish_tasks
-- A batch's outcome, fenced by its claim: each task's output (or error) recorded, a pipeline's
-- task sent on to its next step, memoizable results stored, the batch recorded, and everyone
-- waiting woken; all or nothing. A task requeued meanwhile (its claim gone) is left alone.
-- The batch is recorded as the calls of the entry point it took: one, or several for a task
-- larger than max_batch_size, each a row of its own ($5 their ids, $11 their items, $14 and
-- $15 their times; $8 and $9 are the batch's whole, which its tasks' times say).
WITH done AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])
        AS d(task_id, output, error)
), finished AS (
    UPDATE serving_tasks t SET
        state = CASE WHEN d.error IS NOT NULL THEN 'failed'
                     WHEN t.step + 1 < cardinality(t.steps) THEN 'queued'
                     ELSE 'succeeded' END,
        step = CASE WHEN d.error IS NULL AND t.step + 1 < cardinality(t.steps)
                    THEN t.step + 1 ELSE t.step END,
        deployment = CASE WHEN d.error IS NULL AND t.step + 1 < cardinality(t.steps)
                          THEN t.steps[t.step + 2] ELSE t.deployment END,
        input = CASE WHEN d.error IS NULL AND t.step + 1 < cardinality(t.steps)
                     THEN d.output::jsonb ELSE t.input END,
        output = CASE WHEN d.error IS NULL AND t.step + 1 >= cardinality(t.steps)
                      THEN d.output::jsonb END,
        error = d.error,
        claim = NULL,
        tries = CASE WHEN d.error IS NULL AND t.step + 1 < cardinality(t.steps)
                     THEN 0 ELSE t.tries END,
        finished_at = CASE WHEN d.error IS NOT NULL OR t.step + 1 >= cardinality(t.steps)
                           THEN now() END,
        step_times = t.step_times || jsonb_build_object(
            'deployment', t.deployment, 'replica', t.replica, 'batch', ($5::uuid[])[1],
            'invocation_ms', $8::float8, 'inference_ms', $9::float8)
    FROM done d
    WHERE t.task_id = d.task_id AND t.claim = $4 AND t.state = 'running'
    RETURNING t.task_id, t.state, t.tenant, t.deployment, t.memo_key, t.output
), memo AS (
    INSERT INTO serving_memo (tenant, deployment, key, output, created_at, used_at)
    SELECT tenant, deployment, memo_key, output, now(), now() FROM finished
    WHERE state = 'succeeded' AND memo_key IS NOT NULL
    ON CONFLICT DO NOTHING
), batch AS (
    -- Only what was recorded counts: a batch whose claim had been taken back (its replica
    -- timed out) leaves no row, and its tasks are counted by the batch that finishes them.
    INSERT INTO serving_batches (batch_id, tenant, deployment, replica, tasks, items, reason,
                                 outcome, invocation_ms, inference_ms, at)
    -- Its tasks are counted once, by its first call (the batch their times name).
    SELECT c.batch_id, $6, $7, $10, CASE WHEN c.n = 1 THEN f.tasks ELSE 0 END, c.items, $12,
           $13, c.invocation_ms, c.inference_ms, now()
    FROM (SELECT count(*) AS tasks FROM finished) f,
         unnest($5::uuid[], $11::int[], $14::float8[], $15::float8[]) WITH ORDINALITY
             AS c(batch_id, items, invocation_ms, inference_ms, n)
    WHERE f.tasks > 0
), woken AS (
    -- A pipeline's task sent on wakes its next deployment's feeds; a finished one, its waiter.
    SELECT pg_notify('serving', CASE state WHEN 'queued' THEN tenant || '.' || deployment
                                           ELSE 'results' END)
    FROM finished
)
SELECT (SELECT count(*) FROM finished) AS recorded, (SELECT count(*) FROM woken) AS woken;

-- name: requeue_replica
-- A replica is gone (it died, or its agent restarted): the tasks it held go back to the queue
-- for another (or the same, restarted) replica; one claimed $2 times fails instead, saying so
-- (a task that kills every replica running it would otherwise hold its deployment's queue
-- for good: it is the oldest). A task given back runs alone next time (claim_tasks), so the
-- tasks batched with a deadly one are not failed with it.
WITH requeued AS (
    UPDATE serving_tasks SET
        state = CASE WHEN tries >= $2 THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN tries >= $2
                     THEN format('its replica was lost while running it, %s times', tries)
                END,
        finished_at = CASE WHEN tries >= $2 THEN now() END,
        claim = NULL
    WHERE replica = $1 AND state = 'running'
    RETURNING tenant, deployment, state
)
SELECT count(*) AS requeued,
       count(pg_notify('serving', CASE state WHEN 'queued' THEN tenant || '.' || deployment
                                             ELSE 'results' END)) AS woken
FROM requeued;

-- name: stalled_tasks
-- The lifecycle manager: tasks a replica has held past its deployment's task timeout. The
-- replica is replaced; the task goes back to the queue, or fails after `$1` tries.
WITH stalled AS (
    SELECT t.task_id, t.replica, t.tenant, t.deployment,
           (d.spec -> 'serving' ->> 'task_timeout_s')::float8 AS timeout_s
    FROM serving_tasks t
    JOIN deployments d ON d.tenant = t.tenant AND d.name = t.deployment
    WHERE t.state = 'running'
      AND t.claimed_at < now() - make_interval(secs => (d.spec -> 'serving' ->> 'task_timeout_s')::float8)
    FOR UPDATE OF t SKIP LOCKED
), moved AS (
    UPDATE serving_tasks t SET
        state = CASE WHEN t.tries >= $1 THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN t.tries >= $1
                     THEN format('no replica answered within %ss, in %s tries', s.timeout_s, t.tries)
                END,
        finished_at = CASE WHEN t.tries >= $1 THEN now() END,
        claim = NULL
    FROM stalled s WHERE t.task_id = s.task_id
    RETURNING t.task_id, t.state
)
-- One row per task (the caller takes each replica once).
SELECT s.tenant, s.deployment, s.replica, s.timeout_s,
       pg_notify('serving', CASE m.state WHEN 'queued' THEN s.tenant || '.' || s.deployment
                                         ELSE 'results' END)
FROM stalled s JOIN moved m USING (task_id);

-- name: fail_orphaned_tasks
-- The lifecycle manager: tasks queued for a deployment that was deleted (sent in the moment
-- before the read model knew) fail, saying so, rather than wait forever.
WITH orphaned AS (
    UPDATE serving_tasks t SET state = 'failed', finished_at = now(),
        error = format('deployment %s was deleted before a replica ran it', t.deployment)
    FROM deployments d
    WHERE d.tenant = t.tenant AND d.name = t.deployment AND d.deleted AND t.state = 'queued'
    RETURNING t.task_id
)
SELECT count(*) AS failed, count(pg_notify('serving', 'results')) AS woken FROM orphaned;

-- name: evict_memo
-- Bounded memoization: each deployment keeps its `memo_max_entries` most recently used results
-- (those used before the one at that rank go; results used in the same instant stay together).
-- The rank is found once per deployment (an index scan of its memo), not once per result.
WITH cutoffs AS (
    SELECT d.tenant, d.name,
           (SELECT k.used_at FROM serving_memo k
            WHERE k.tenant = d.tenant AND k.deployment = d.name
            ORDER BY k.used_at DESC
            OFFSET (d.spec -> 'serving' ->> 'memo_max_entries')::int - 1 LIMIT 1) AS cutoff
    FROM deployments d
)
DELETE FROM serving_memo m
USING cutoffs c
WHERE m.tenant = c.tenant AND m.deployment = c.name AND m.used_at < c.cutoff;

-- name: forget_tasks
-- Retention: finished tasks, and batches, older than the retention period.
WITH tasks AS (
    DELETE FROM serving_tasks WHERE finished_at < now() - make_interval(secs => $1)
), batches AS (
    DELETE FROM serving_batches WHERE at < now() - make_interval(secs => $1)
)
SELECT 1;

-- name: deployment_figures
-- GET /v1/deployments/{name}/metrics: its figures over the tasks and batches kept.
SELECT
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND steps[1] = $2 AND pipeline IS NULL) AS requests,
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND steps[1] = $2 AND pipeline IS NULL AND state = 'succeeded') AS succeeded,
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND steps[1] = $2 AND pipeline IS NULL AND state = 'failed') AS failed,
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND deployment = $2 AND state = 'queued') AS queue_depth,
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND deployment = $2 AND state = 'running') AS running,
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND steps[1] = $2 AND memo = 'hit') AS memo_hits,
    (SELECT count(*) FROM serving_tasks
     WHERE tenant = $1 AND steps[1] = $2 AND memo = 'miss') AS memo_misses,
    (SELECT count(*) FROM serving_memo WHERE tenant = $1 AND deployment = $2) AS memo_entries,
    (SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                ORDER BY extract(epoch FROM finished_at - submitted_at) * 1000)
     FROM serving_tasks
     WHERE tenant = $1 AND steps[1] = $2 AND pipeline IS NULL AND finished_at IS NOT NULL)
        AS latency_ms,
    b.batches, b.items, b.max_items, b.full, b.timeout, b.idle, b.invocation_ms, b.inference_ms
FROM (
    SELECT count(*) AS batches, coalesce(sum(items), 0) AS items,
           coalesce(max(items), 0) AS max_items,
           count(*) FILTER (WHERE reason = 'full') AS full,
           count(*) FILTER (WHERE reason = 'timeout') AS timeout,
           count(*) FILTER (WHERE reason = 'idle') AS idle,
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY invocation_ms)
               AS invocation_ms,
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY inference_ms)
               AS inference_ms
    FROM serving_batches WHERE tenant = $1 AND deployment = $2
) b;

-- name: offer_channel
-- An agent offers its replica on its serving channel (again after the agent restarted: its new
-- address and token replace the old).
INSERT INTO serving_channels (replica, tenant, deployment, node, address, token, offered_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
ON CONFLICT (replica) DO UPDATE SET
    tenant = excluded.tenant, deployment = excluded.deployment, node = excluded.node,
    address = excluded.address, token = excluded.token, offered_at = excluded.offered_at;

-- name: withdraw_channel
-- An agent's replica stopped serving: the direct path no longer goes there.
DELETE FROM serving_channels WHERE replica = $1;

-- name: direct_channels
-- A synchronous prediction's route (cached a moment by each control plane process): the
-- channels of the deployment's replicas that serve it now ($3, from its stream: a replica
-- retired, or whose agent died without withdrawing it, is left out, or refuses, and the
-- request then takes the queue's path).
SELECT replica, address, token FROM serving_channels
WHERE tenant = $1 AND deployment = $2 AND replica = ANY($3::uuid[]);

-- name: memo_output
-- A synchronous prediction the process's own memo does not hold: the durable memo's result,
-- if any (its use is recorded with the task, off the request's path).
SELECT output::text AS output FROM serving_memo WHERE tenant = $1 AND deployment = $2 AND key = $3;

-- name: record_direct_tasks
-- Counting the synchronous predictions the direct path answered (a replica's, or the memo's),
-- written in groups after their answers: the same rows as the queue's finished tasks, so that
-- figures, audit and GET /v1/tasks/{id} read them alike. A group written twice (a retry after
-- a lost answer) adds nothing. A memo hit's input is not copied (NULL here): its memo_key names
-- it, and nothing reads a finished task's input; the column holds JSON null for it.
INSERT INTO serving_tasks (task_id, tenant, steps, deployment, items, input, state, output,
                           error, memo, memo_key, replica, tries, submitted_at, finished_at,
                           step_times)
SELECT t.task_id, t.tenant, ARRAY[t.deployment], t.deployment, t.items,
       coalesce(t.input::jsonb, 'null'),
       t.state, t.output::jsonb, t.error, t.memo, t.memo_key, t.replica, t.tries,
       t.submitted_at, t.finished_at, t.step_times::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $6::text[], $7::text[],
            $8::text[], $9::text[], $10::bytea[], $11::uuid[], $12::int[], $13::timestamptz[],
            $14::timestamptz[], $15::text[])
    AS t(task_id, tenant, deployment, items, input, state, output, error, memo, memo_key,
         replica, tries, submitted_at, finished_at, step_times)
ON CONFLICT (task_id) DO NOTHING;

-- name: record_direct_batches
-- The batches the direct path's tasks ran in, as the agent reported them with each answer:
-- every control plane process whose request was in a batch reports it, the first one records
-- it (its task count is the agent's: all the batch's requests, whoever sent them).
INSERT INTO serving_batches (batch_id, tenant, deployment, replica, tasks, items, reason,
                             outcome, invocation_ms, inference_ms, at)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::int[], $6::int[],
                     $7::text[], $8::text[], $9::float8[], $10::float8[], $11::timestamptz[])
ON CONFLICT (batch_id) DO NOTHING;

-- name: record_direct_memo
-- The direct path's results to memoize, and the durable memo's entries it answered from (their
-- use, for eviction's order): one statement for the group (each key once in it: the writer
-- keeps a key's latest).
INSERT INTO serving_memo (tenant, deployment, key, output, created_at, used_at)
SELECT m.tenant, m.deployment, m.key, m.output::jsonb, m.at, m.at
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::timestamptz[])
    AS m(tenant, deployment, key, output, at)
ON CONFLICT (tenant, deployment, key) DO UPDATE SET
    used_at = greatest(serving_memo.used_at, excluded.used_at);

-- name: retarget_tasks
-- The controller: tasks queued for a model version the deployment no longer serves (its canary
-- rolled back, or promoted over the version they were sent to; or sent by a process whose view
-- lagged the move) go to its own version, and its replicas are woken for them: never stranded.
WITH moved AS (
    UPDATE serving_tasks t SET version = NULL
    FROM deployments d
    WHERE d.tenant = t.tenant AND d.name = t.deployment AND t.state = 'queued'
      AND t.version IS NOT NULL AND t.version <> d.version
      AND t.version IS DISTINCT FROM d.canary_version
    RETURNING t.tenant, t.deployment
)
SELECT count(pg_notify('serving', tenant || '.' || deployment)) AS woken
FROM (SELECT DISTINCT tenant, deployment FROM moved) AS m;

-- name: canary_errors
-- The controller's rollback rule (canary.py): each canary with a rule, its requests finished
-- within its window since it started, and how many failed. Its requests: those sent to its
-- version (the queue's) and those its replicas answered (the direct path's rows name the
-- replica). A task cancelled by its owner is no error of the model. Only those past their rule
-- (the service decides again on the stream's rule, canary.rollback_reason): a sweep reads no
-- stream for a canary doing well.
SELECT d.tenant, d.name, d.canary_version AS version,
       count(t.task_id) AS finished,
       count(t.task_id) FILTER (WHERE t.state = 'failed') AS failed
FROM deployments d
LEFT JOIN serving_tasks t
    ON t.tenant = d.tenant AND t.deployment = d.name
   AND t.state IN ('succeeded', 'failed')
   AND t.submitted_at >= d.canary_started_at
   AND t.finished_at > now() - make_interval(secs => (d.canary_rollback ->> 'window_s')::float8)
   AND (t.version = d.canary_version OR t.replica = ANY (d.canary_jobs))
   AND t.error IS DISTINCT FROM 'cancelled by its owner'
WHERE d.canary_rollback IS NOT NULL AND NOT d.deleted
GROUP BY d.tenant, d.name, d.canary_version, d.canary_rollback
HAVING count(t.task_id) >= (d.canary_rollback ->> 'min_requests')::int
   AND count(t.task_id) FILTER (WHERE t.state = 'failed')
       > (d.canary_rollback ->> 'max_error_rate')::float8 * count(t.task_id);
