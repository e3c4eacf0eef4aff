-- The counters (job_counts) also hold the CPUs and memory their jobs' learners ask for, so that
-- admission reads what a tenant's live jobs hold from a few counter rows (`tenant_usage`)
-- instead of summing over its live jobs' documents on every submission: with 3,000 jobs queued
-- that sum took 27 ms of the database's CPU a submission, which at 200 submissions a second on
-- two cores is more than the machine has, and it grew with the queue.
--
-- An inference job asks for none (its deployment's replicas hold its room). `cpus` is a decimal
-- of a fixed scale, not a float: a counter moves by each job's learners x CPUs (rounded to a
-- millionth of a CPU) as it comes and goes, and such sums are exact in any order and always
-- written alike, so that a rebuild (which folds in other batches) makes the very same rows, and
-- a counter never keeps a rounding error once its jobs have left.
ALTER TABLE job_counts
    ADD COLUMN cpus numeric(24, 6) NOT NULL DEFAULT 0,
    ADD COLUMN memory_mb bigint NOT NULL DEFAULT 0;
ALTER TABLE job_counts ALTER COLUMN cpus DROP DEFAULT, ALTER COLUMN memory_mb DROP DEFAULT;

-- Under the projection's lock (`lock_projection`), as 0029 counted the jobs: no batch commits
-- between the sums and this migration's commit.
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.projection:jobs', 0));
WITH room AS (
    SELECT labels AS job_labels, tenant, state,
           CASE WHEN inference THEN 0
                ELSE round(learners * (doc -> 'manifest' ->> 'cpus')::numeric, 6) END AS cpus,
           CASE WHEN inference THEN 0 ELSE learners * memory_mb_per_learner END AS memory_mb
    FROM job_status
), held AS (
    SELECT '{}'::jsonb AS labels, tenant, state, sum(cpus) AS cpus, sum(memory_mb) AS memory_mb
    FROM room GROUP BY tenant, state
    UNION ALL
    SELECT jsonb_build_object(pair.key, pair.value), tenant, state, sum(cpus), sum(memory_mb)
    FROM room, jsonb_each(job_labels) AS pair
    GROUP BY 1, tenant, state
)
UPDATE job_counts c SET cpus = held.cpus, memory_mb = held.memory_mb
FROM held
WHERE (c.labels, c.tenant, c.state) = (held.labels, held.tenant, held.state);
