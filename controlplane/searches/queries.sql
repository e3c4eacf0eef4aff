-- Searches (controlplane/searches): the `searches` projection's writes, the API's reads, and
-- the search driver's look at what to advance.

-- name: insert_search
-- SearchSubmitted. `rungs`: how many rungs its searcher has, so that a finished rung's trial is
-- paused below the top one and completed at it, as the search's own fold says.
INSERT INTO searches (search_id, tenant, name, state, searcher, metric, mode, max_trials, rungs,
                      spec, labels, created_at, updated_at)
VALUES ($1, $2, $3, 'running', $4, $5, $6, $7, $8, $9::jsonb, $10::jsonb, $11, $11)
ON CONFLICT (search_id) DO NOTHING;

-- name: insert_trial
-- TrialCreated.
WITH trial AS (
    INSERT INTO search_trials (search_id, number, job_id, rung, budget, state, point, results,
                               parent, reason, created_at, updated_at)
    VALUES ($1, $2, $3, 0, $4, 'running', $5::jsonb, '[]'::jsonb, $6, $7, $8, $8)
    ON CONFLICT (search_id, number) DO NOTHING
    RETURNING search_id
)
UPDATE searches s SET trials = s.trials + 1, updated_at = $8
FROM trial WHERE s.search_id = trial.search_id;

-- name: promote_trial
-- TrialPromoted: the trial's next rung runs in a job of its own.
UPDATE search_trials
SET job_id = $3, rung = $4, budget = $5, state = 'running', reason = $6, updated_at = $7
WHERE search_id = $1 AND number = $2;

-- name: finish_rung
-- TrialRungFinished: paused at a rung below the top (a promotion may come), completed at it.
UPDATE search_trials t
SET results = t.results || jsonb_build_array(jsonb_build_array($3::integer, $4::float8)),
    metric = $4,
    state = CASE WHEN $3 >= s.rungs - 1 THEN 'completed' ELSE 'paused' END,
    updated_at = $5
FROM searches s
WHERE t.search_id = $1 AND t.number = $2 AND s.search_id = t.search_id;

-- name: end_trial
-- TrialFailed or TrialPruned, with why.
UPDATE search_trials SET state = $3, reason = $4, updated_at = $5
WHERE search_id = $1 AND number = $2;

-- name: update_best
UPDATE searches SET best_trial = $2, best_rung = $3, best_metric = $4, updated_at = $5
WHERE search_id = $1;

-- name: end_search
-- SearchEnded: the trials still running are cancelled with it (the driver stops their jobs).
WITH ended AS (
    UPDATE searches SET state = $2, reason = $3, ended_at = $4, updated_at = $4
    WHERE search_id = $1
    RETURNING search_id
)
UPDATE search_trials t SET state = 'cancelled', reason = $3, updated_at = $4
FROM ended WHERE t.search_id = ended.search_id AND t.state = 'running';

-- name: searches_to_drive
-- The searches the driver must look at now, from the read model and the log's own job streams
-- (not the jobs projection, which may not have caught up with the event that woke it): those
-- with a running trial whose job has ended or was never submitted (a crash between recording
-- a decision and submitting its job), those running with no trial running (a new search, or
-- one whose searcher has something to decide), and those with a cancelled trial whose job
-- still runs. A trial's job's last event is found by the (stream_id, stream_version) key.
SELECT DISTINCT t.search_id
FROM search_trials t
LEFT JOIN LATERAL (
    SELECT e.type FROM events e
    WHERE e.stream_id = 'job-' || t.job_id
    ORDER BY e.stream_version DESC LIMIT 1
) last ON true
WHERE t.state IN ('running', 'cancelled')
  AND CASE t.state
      WHEN 'running' THEN last.type IS NULL
                          OR last.type IN ('JobCompleted', 'JobFailed', 'JobCancelled')
      ELSE last.type NOT IN ('JobCompleted', 'JobFailed', 'JobCancelled')
  END
UNION
SELECT s.search_id FROM searches s
WHERE s.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM search_trials t
                  WHERE t.search_id = s.search_id AND t.state = 'running');

-- name: trial_job_heads
-- Each of these jobs' last event type (NULL: not submitted yet), by the log's stream key.
SELECT j.job_id, last.type
FROM unnest($1::uuid[]) AS j(job_id)
LEFT JOIN LATERAL (
    SELECT e.type FROM events e
    WHERE e.stream_id = 'job-' || j.job_id
    ORDER BY e.stream_version DESC LIMIT 1
) last ON true;

-- name: trial_jobs_released
-- Of these jobs, those none of whose learners still holds an allocation: their agents stored
-- every line the learners wrote (they flush before they give an allocation back), so their
-- metric reports are complete.
SELECT j.job_id FROM unnest($1::uuid[]) AS j(job_id)
WHERE NOT EXISTS (SELECT 1 FROM allocations a
                  WHERE a.job_id = j.job_id AND a.released_at IS NULL);

-- name: list_searches
-- GET /v1/searches: a tenant's searches (the admin's: everyone's), newest first, a page after
-- the cursor (created_at, search_id).
SELECT search_id, tenant, name, state, searcher, metric, mode, max_trials, trials, best_trial,
       best_rung, best_metric, reason, labels, created_at, updated_at, ended_at
FROM searches
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text IS NULL OR state = $2)
  AND ($3::timestamptz IS NULL OR (created_at, search_id) < ($3, $4::uuid))
ORDER BY created_at DESC, search_id DESC
LIMIT $5;

-- name: count_searches
-- How many searches the same filters match: the list shows its total, never a page silently cut.
SELECT count(*) FROM searches
WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR state = $2);

-- name: search_row
SELECT search_id, tenant, name, state, searcher, metric, mode, max_trials, trials, best_trial,
       best_rung, best_metric, reason, labels, created_at, updated_at, ended_at, spec
FROM searches WHERE search_id = $1;

-- name: search_trials
-- GET /v1/searches/{id}/trials: every trial, in number order.
SELECT number, job_id, rung, budget, state, point, results, metric, parent, reason, created_at,
       updated_at
FROM search_trials WHERE search_id = $1 ORDER BY number;

-- name: search_curve_trials
-- GET /v1/searches/{id}/curves: a page of the search's trials (after trial $2; only those in
-- $3 when it is given), in number order, with the rung each reached: its jobs are one per rung
-- up to it, their ids derived from the search, the trial and the rung.
SELECT number, rung, state FROM search_trials
WHERE search_id = $1 AND number > $2 AND ($3::integer[] IS NULL OR number = ANY ($3))
ORDER BY number
LIMIT $4;

-- name: search_trial_curves
-- GET /v1/searches/{id}/curves: of these jobs ($1, each its trial $2 and rung $3), the stored
-- stdout lines that may report the metric ($4: its quoted name and a colon, as the learner's
-- JSON writes it), thinned to about $5 per trial and learner, evenly in the order they were
-- stored (the first and the last always kept): a thousand trials of long training then make a
-- response of a few megabytes, and only the kept lines leave the database. Each job's lines
-- are read through the index, job by job (the lateral join, kept from being flattened into a
-- join by its OFFSET 0), whatever the planner guesses of a log just written (with a stale
-- estimate of one line it otherwise scans the whole table once per job). The lines are sorted
-- with their text (a sort that may spill to disk): reading the kept ones again by their id
-- instead took twice as long. A trial's rungs come in rung order, each job's lines in its
-- log's order, so a step reported again (a restart, a promotion resuming from a checkpoint)
-- comes after the report it replaces. The caller parses each line (`runners.protocol.parse`):
-- a look-alike line the user printed is ordinary output there, never an error here; `total`
-- is how many lines the trial's learner has before thinning.
WITH jobs AS (
    SELECT * FROM unnest($1::uuid[], $2::integer[], $3::integer[]) AS j(job_id, number, rung)
), numbered AS (
    SELECT j.number, j.rung, l.learner, l.id, l.line,
           row_number() OVER w AS n,
           count(*) OVER (PARTITION BY j.number, l.learner) AS total
    FROM jobs j
    CROSS JOIN LATERAL (
        SELECT learner, id, line FROM job_logs
        WHERE job_id = j.job_id AND stream = 'stdout'
          AND line LIKE '@@trainyard/1 {%"kind":"metric"%' AND strpos(line, $4) > 0
        OFFSET 0
    ) l
    WINDOW w AS (PARTITION BY j.number, l.learner ORDER BY j.rung, l.id)
)
SELECT number, learner, line, total FROM numbered
WHERE n = 1 OR n = total OR (n * $5) / total <> ((n - 1) * $5) / total
ORDER BY number, learner, rung, id;
