-- Learner logs' statements: storing lines, reading them back, what a job has logged, and
-- forgetting a job's lines once its retention has passed.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: reserve_log_ids
-- Learner logs: lock the heads of the jobs a batch writes to and take ids for its lines
-- ($2 per job). The row locks last until the writer commits, so the next writer of a job waits
-- here and ids commit in increasing order: a reader's `id > cursor` never skips a late commit.
-- Heads are locked in job_id order, so writers of overlapping sets of jobs cannot deadlock.
-- `updated_at` is the time the lock was granted, not the start of a wait for it. Each job's
-- tenant comes back too, for the lines' `tenant` (what search filters on, migration 0034; NULL
-- for a job job_status does not know).
INSERT INTO job_log_heads AS h (job_id, last_id, updated_at)
SELECT b.job_id, b.lines, clock_timestamp()
FROM unnest($1::uuid[], $2::bigint[]) AS b(job_id, lines)
ORDER BY b.job_id
ON CONFLICT (job_id) DO UPDATE
SET last_id = h.last_id + excluded.last_id, updated_at = clock_timestamp()
RETURNING job_id, last_id, (SELECT s.tenant FROM job_status s WHERE s.job_id = h.job_id);

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

-- name: job_metric_lines
-- The learner reports among a job's log lines that carry metrics, in the order stored.
SELECT attempt, learner, line FROM job_logs
WHERE job_id = $1 AND stream = 'stdout' AND line LIKE '@@trainyard/1 {%"kind":"metric"%'
ORDER BY id;

-- name: forget_job_logs
-- Log retention (the lifecycle manager, each sweep): the lines, heads and series of at most $2
-- jobs that ended, and whose last line was stored, more than $1 seconds ago; how many jobs'
-- logs went. Through the owner's function (migration 0027), as the application may not delete
-- lines itself.
SELECT forget_job_logs(make_interval(secs => $1), $2);

-- name: check_log_pattern
-- Log search: compiles a regular expression once, before the search, so that a malformed one
-- is refused (invalid_regular_expression, a 400 naming `pattern`) whether or not any line would
-- have been tested against it.
SELECT '' ~ $1;

-- name: search_job_logs
-- Log search: up to $10 of tenant $1's lines that match the regular expression $2 (a substring
-- arrives escaped as one; $3: ignoring case), newest first by (at, job_id, id), below the
-- cursor ($4, $5, $6; none on the first page). Optionally of the jobs $7 only, of the jobs whose
-- labels hold $8, stored at or after $9, and without the launcher's reports unless $11.
-- Reads job_log_searched, the indexed copy of the lines and the few queued for it, in one
-- snapshot (migrations/0035_log_search_indexer.sql): a line is found once its writer commits.
-- Planned for each call's own values (the caller sets plan_cache_mode): the NULL filters fold
-- away, and the pattern's estimated frequency chooses between reading the tenant's lines
-- newest first (job_log_search_order: common terms) and the trigram index
-- (job_log_search_trigrams: rare terms); the queued lines are matched one by one.
SELECT l.job_id, l.attempt, l.learner, l.stream, l.seq, l.id, l.at, l.line
FROM job_log_searched l
WHERE l.tenant = $1
  AND CASE WHEN $3::boolean THEN l.line ~* $2 ELSE l.line ~ $2 END
  AND ($4::timestamptz IS NULL OR (l.at, l.job_id, l.id) < ($4, $5::uuid, $6::bigint))
  AND ($7::uuid[] IS NULL OR l.job_id = ANY ($7))
  AND ($8::jsonb IS NULL OR l.job_id IN (SELECT s.job_id FROM job_status s
                                         WHERE s.tenant = $1 AND s.labels @> $8))
  AND ($9::timestamptz IS NULL OR l.at >= $9)
  AND ($11::boolean OR NOT (l.stream = 'stdout' AND l.line LIKE '@@trainyard/1 {%'))
ORDER BY l.at DESC, l.job_id DESC, l.id DESC
LIMIT $10;

-- name: follow_job_logs
-- Log search, followed: up to $10 of tenant $1's matching lines (as `search_job_logs`) above
-- the cursor ($4, $5, $6) in the search's order, oldest first, printed more than $12 seconds
-- ago by the database's clock. A line is stored a moment after it is printed (an agent ships
-- each learner's lines every fraction of a second), so a follower that waits that long sees
-- every line of the moment before its cursor moves past it; one stored later still is found by
-- searching, not by following. Like the search, it reads the indexed and the queued lines.
SELECT l.job_id, l.attempt, l.learner, l.stream, l.seq, l.id, l.at, l.line
FROM job_log_searched l
WHERE l.tenant = $1
  AND CASE WHEN $3::boolean THEN l.line ~* $2 ELSE l.line ~ $2 END
  AND (l.at, l.job_id, l.id) > ($4::timestamptz, $5::uuid, $6::bigint)
  AND l.at <= now() - make_interval(secs => $12)
  AND ($7::uuid[] IS NULL OR l.job_id = ANY ($7))
  AND ($8::jsonb IS NULL OR l.job_id IN (SELECT s.job_id FROM job_status s
                                         WHERE s.tenant = $1 AND s.labels @> $8))
  AND ($9::timestamptz IS NULL OR l.at >= $9)
  AND ($11::boolean OR NOT (l.stream = 'stdout' AND l.line LIKE '@@trainyard/1 {%'))
ORDER BY l.at, l.job_id, l.id
LIMIT $10;

-- name: log_follow_start
-- Where a follow of the log search starts: the lines printed from now on (by the database's
-- clock).
SELECT now();

-- name: index_job_log_lines
-- Log search's indexer (controlplane.logs.indexer, a worker of each replica; several at once
-- take different queued ranges): copies about $1 queued lines into the search's indexed table;
-- how many it copied (migrations/0035_log_search_indexer.sql).
SELECT index_job_log_lines($1);
