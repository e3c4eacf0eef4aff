-- Inference jobs: the job's row (service.py), its queries, claimed by node agents for their
-- replicas (node_agent/inference.py), and its statistics (stats.py). Claims and results wake
-- the replicas waiting for their turn with one NOTIFY on the serving channel, payload
-- 'inference' (deployments/wakeups.py); a hint only, they also poll.

-- name: insert_inference_job
-- The job's row, once (the service writes it after the job's JobSubmitted; the lifecycle
-- manager writes it again for a job whose control plane died in between: nothing changes).
INSERT INTO inference_jobs (job_id, tenant, deployment, weight, batch_size, queries, input,
                            created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, now())
ON CONFLICT (job_id) DO NOTHING;

-- name: live_inference_jobs
-- The lifecycle manager: inference jobs not yet ended, with where they are (the job's state,
-- from the jobs' read model) and their progress: queries started, finished, not finished.
-- A job submitted whose row is missing (its control plane died between the two) shows with
-- `deployment` NULL, for the manager to write it.
SELECT s.job_id, s.tenant, s.state, s.doc -> 'manifest' AS manifest, j.deployment, j.queries,
       j.started, j.load_error,
       (SELECT count(*) FROM inference_queries q
        WHERE q.job_id = s.job_id AND q.finished_at IS NULL) AS unfinished
FROM job_status s
LEFT JOIN inference_jobs j USING (job_id)
WHERE s.inference AND s.state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- name: ended_inference_jobs
-- The lifecycle manager: inference jobs that ended (completed, cancelled, failed) but still
-- take queries: they take no more, and their deployment goes.
SELECT j.job_id, j.tenant, j.deployment
FROM inference_jobs j
JOIN job_status s USING (job_id)
WHERE NOT j.done AND s.state IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- name: end_inference_job
-- No more queries: those queued (given back by a lost replica) will not run.
UPDATE inference_jobs SET done = true WHERE job_id = $1;

-- name: claim_query
-- A replica asks for its job's next query ($1 job, $2 replica, $3 claim token, $4 node,
-- $5 seconds a replica counts as present after it last asked). It gets a query given back by
-- a lost replica first (already counted), else the next new one, made here, if the job has
-- not started more than its weight's share: its fair time (started / weight) is at most the
-- least of the other jobs taking queries now (a replica of theirs asked within $5 seconds).
-- Throughput follows the weights across the cluster, as in IDunno, whatever the models'
-- speeds: a job ahead waits for the others, and the replicas' nodes give the time it leaves
-- to theirs. A job that starts or comes back after a pause joins at that least, so it neither
-- waits for the others to drain nor takes a burst to catch up. Every ask is recorded
-- (inference_replicas): it keeps the job present, and says which replicas run which job, and
-- where. The job's row is locked: its replicas take its queries one after another; other
-- jobs' replicas never wait for it. A claim tried again with its token after its answer was
-- lost (it committed on a primary that died before answering; the standby promoted has it)
-- gets the query it took: another would leave that one running under a replica that never
-- runs it, until the replica is replaced for holding it past the job's timeout.
-- `outcome`: 'claimed' (index set), 'wait' (not its turn, nothing to take now, or no row yet)
-- or 'done' (the job ended, or every query has finished).
WITH job AS (
    SELECT j.*,
           (SELECT max(r.seen_at) FROM inference_replicas r WHERE r.job_id = j.job_id)
               AS present_at
    FROM inference_jobs j WHERE j.job_id = $1
    FOR UPDATE OF j
), held AS (
    SELECT q.index FROM inference_queries q
    WHERE q.replica = $2 AND q.state = 'running' AND q.claim = $3 AND q.job_id = $1
), floor AS (
    SELECT min(o.vtime) AS vtime
    FROM inference_jobs o
    WHERE NOT o.done AND o.job_id <> $1
      AND EXISTS (SELECT 1 FROM inference_replicas r
                  WHERE r.job_id = o.job_id AND r.seen_at > now() - make_interval(secs => $5))
), fair AS (
    SELECT job.job_id,
           CASE WHEN job.present_at IS NULL
                     OR job.present_at <= now() - make_interval(secs => $5)
                THEN greatest(job.vtime, coalesce(floor.vtime, job.vtime))
                ELSE job.vtime END AS vtime,
           floor.vtime AS floor
    FROM job, floor
    WHERE NOT job.done
), asked AS (
    INSERT INTO inference_replicas (job_id, replica, node, seen_at)
    SELECT job_id, $2, $4, now() FROM job
    ON CONFLICT (job_id, replica) DO UPDATE SET node = excluded.node, seen_at = excluded.seen_at
), given_back AS (
    SELECT q.index FROM inference_queries q, fair
    WHERE q.job_id = fair.job_id AND q.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held)
    ORDER BY q.index
    LIMIT 1
    FOR UPDATE OF q SKIP LOCKED
), retried AS (
    UPDATE inference_queries q
    SET state = 'running', claim = $3, replica = $2, node = $4, tries = q.tries + 1,
        claimed_at = now()
    FROM given_back g
    WHERE q.job_id = $1 AND q.index = g.index
    RETURNING q.index
), advanced AS (
    UPDATE inference_jobs j SET started = j.started + 1, vtime = f.vtime + 1 / j.weight
    FROM fair f
    WHERE j.job_id = f.job_id
      AND NOT EXISTS (SELECT 1 FROM given_back) AND NOT EXISTS (SELECT 1 FROM held)
      AND (j.queries IS NULL OR j.started < j.queries)
      AND (f.floor IS NULL OR f.vtime <= f.floor)
    RETURNING j.started - 1 AS index
), fresh AS (
    INSERT INTO inference_queries (job_id, index, state, claim, replica, node, tries,
                                   started_at, claimed_at)
    SELECT $1, index, 'running', $3, $2, $4, 1, now(), now() FROM advanced
    RETURNING index
), claimed AS (
    SELECT index FROM held UNION ALL SELECT index FROM retried UNION ALL SELECT index FROM fresh
)
SELECT (SELECT index FROM claimed) AS index,
       CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN 'claimed'
            WHEN (SELECT done FROM job) THEN 'done'
            WHEN (SELECT queries IS NOT NULL AND started >= queries FROM job)
                 AND NOT EXISTS (SELECT 1 FROM inference_queries q
                                 WHERE q.job_id = $1 AND q.finished_at IS NULL) THEN 'done'
            ELSE 'wait' END AS outcome,
       (SELECT count(pg_notify('serving', 'inference')) FROM claimed) AS woken;

-- name: replica_present
-- A replica running a long query says it is still there (it asks for no other meanwhile): its
-- job keeps its place in the fair time; one that died stops saying so, and holds nobody back.
UPDATE inference_replicas SET seen_at = now() WHERE job_id = $1 AND replica = $2;

-- name: finish_query
-- A query's result (or the model's error), fenced by its claim: recorded once, by the try
-- that holds it; a query given back meanwhile (its replica timed out) is left alone. Wakes the
-- replicas waiting for their turn (this job's count moved on).
WITH finished AS (
    UPDATE inference_queries SET
        state = CASE WHEN $4::text IS NULL THEN 'succeeded' ELSE 'failed' END,
        output = $3::jsonb,
        error = $4,
        inference_ms = $5,
        finished_at = now(),
        claim = NULL
    WHERE job_id = $1 AND index = $2 AND claim = $6 AND state = 'running'
    RETURNING 1
)
SELECT count(*) AS recorded, count(pg_notify('serving', 'inference')) AS woken FROM finished;

-- name: give_back_queries
-- A replica is gone (it died, or its agent restarted): the queries it held go back, to be
-- taken first by the job's next replica to ask. One that has been tried $2 times fails
-- instead, saying so: a query that kills every replica running it would otherwise stop its
-- job for good (it is always taken first).
WITH given AS (
    UPDATE inference_queries SET
        state = CASE WHEN tries >= $2 THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN tries >= $2
                     THEN format('its replica was lost while running it, %s times', tries)
                END,
        finished_at = CASE WHEN tries >= $2 THEN now() END,
        claim = NULL
    WHERE replica = $1 AND state = 'running'
    RETURNING 1
)
SELECT count(*) AS given_back, count(pg_notify('serving', 'inference')) AS woken FROM given;

-- name: record_load_error
-- A replica could not load the job's model: the lifecycle manager fails the job with this.
UPDATE inference_jobs SET load_error = $2 WHERE job_id = $1 AND load_error IS NULL;

-- name: stalled_queries
-- The lifecycle manager: queries a replica has held past the job's query timeout ($2 by job,
-- from its manifest). They go back (or fail after $1 tries); the replica is replaced.
WITH stalled AS (
    SELECT q.job_id, q.index, q.replica, j.tenant, j.deployment,
           (s.doc -> 'manifest' -> 'inference' ->> 'query_timeout_s')::float8 AS timeout_s
    FROM inference_queries q
    JOIN inference_jobs j USING (job_id)
    JOIN job_status s USING (job_id)
    WHERE q.state = 'running' AND NOT j.done
      AND q.claimed_at < now() - make_interval(
          secs => (s.doc -> 'manifest' -> 'inference' ->> 'query_timeout_s')::float8)
    FOR UPDATE OF q SKIP LOCKED
), moved AS (
    UPDATE inference_queries q SET
        state = CASE WHEN q.tries >= $1 THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN q.tries >= $1
                     THEN format('no replica answered within %ss, in %s tries', s.timeout_s, q.tries)
                END,
        finished_at = CASE WHEN q.tries >= $1 THEN now() END,
        claim = NULL
    FROM stalled s WHERE q.job_id = s.job_id AND q.index = s.index
    RETURNING q.job_id
)
SELECT DISTINCT s.tenant, s.deployment, s.replica, s.timeout_s,
       (SELECT count(pg_notify('serving', 'inference')) FROM moved) AS woken
FROM stalled s;

-- name: query_stats
-- GET /v1/jobs/{id}/stats: a job's figures from every query recorded (exact: no buckets), for
-- the job (replica NULL) and for each replica that finished some. Latency is claimed_at to
-- finished_at of the try that recorded the result; the window counts results recorded in the
-- last $2 seconds.
SELECT q.replica, max(q.node) AS node,
       count(*) FILTER (WHERE q.finished_at IS NOT NULL) AS finished,
       count(*) FILTER (WHERE q.state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE q.state = 'failed') AS failed,
       count(*) FILTER (WHERE q.state = 'running') AS running,
       count(*) FILTER (WHERE q.state = 'queued') AS queued,
       count(*) FILTER (WHERE q.tries > 1) AS retried,
       count(*) FILTER (WHERE q.finished_at > now() - make_interval(secs => $2)) AS in_window,
       min(q.started_at) AS first_started_at,
       max(q.finished_at) AS last_finished_at,
       now() AS at,
       avg(q.ms) AS mean_ms,
       stddev_pop(q.ms) AS std_ms,
       min(q.ms) AS min_ms,
       max(q.ms) AS max_ms,
       percentile_cont(ARRAY[0.5, 0.9, 0.95, 0.99]) WITHIN GROUP (ORDER BY q.ms)
           AS percentiles_ms,
       -- IDunno's query rate: each query's 1 / its time, in queries per second.
       avg(1000 / q.ms) AS rate_mean,
       stddev_pop(1000 / q.ms) AS rate_std,
       percentile_cont(ARRAY[0.5, 0.9, 0.95, 0.99]) WITHIN GROUP (ORDER BY 1000 / q.ms)
           AS rate_percentiles
FROM (
    -- NULL until finished; a time of 0 (a clock's resolution) has no rate: counted as 1 µs.
    SELECT *, CASE WHEN finished_at IS NOT NULL THEN greatest(
               (extract(epoch FROM finished_at - claimed_at) * 1000)::float8, 0.001) END AS ms
    FROM inference_queries WHERE job_id = $1
) q
GROUP BY GROUPING SETS ((), (q.replica))
ORDER BY q.replica NULLS FIRST;

-- name: inference_replicas
-- Which replicas ask for a job's queries, where they run, and when each last asked.
SELECT replica, node, seen_at FROM inference_replicas WHERE job_id = $1 ORDER BY node, replica;

-- name: list_queries
-- GET /v1/jobs/{id}/queries: a job's queries in order, after index $2.
SELECT index, state, replica, node, tries, started_at, claimed_at, finished_at,
       (extract(epoch FROM finished_at - claimed_at) * 1000)::float8 AS latency_ms, inference_ms,
       output, error
FROM inference_queries
WHERE job_id = $1 AND index > $2
ORDER BY index
LIMIT $3;

-- name: inference_job
-- The job's row, for its replicas' feeds (what to run) and its views.
SELECT * FROM inference_jobs WHERE job_id = $1;
